"""How the proxies reach their upstreams: a lean HTTP/1.1 client (`http1`), an incremental
Server-Sent Events parser (`sse`), and backend health with circuit breakers (`health`)."""
