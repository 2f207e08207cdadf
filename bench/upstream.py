"""A fast OpenAI-compatible upstream for the gateway benchmarks: raw asyncio (uvloop when
installed), HTTP/1.1 keep-alive, TCP_NODELAY, no framework.

`POST /v1/chat/completions` and `/v1/completions` answer `max_tokens` tokens (default
`--tokens`), one every `--pace-ms` milliseconds on an absolute schedule (start + i x pace, so
late wake-ups do not accumulate), streamed as vLLM does (`data: <json>\\n\\n` events, one HTTP
chunk each, a role chunk first, a finish chunk, a `choices: []` usage chunk when
`stream_options.include_usage`, `data: [DONE]`), or as one JSON body after the same time when
not streaming. `GET /health` and `GET /v1/models` (every model name is served) for the gateways'
probes and catalogues.

    python bench/upstream.py --port 8100 --tokens 32 --pace-ms 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time

_ID = b"chatcmpl-bench"


class Upstream:
    def __init__(self, tokens: int, pace_s: float, model: str = "bench-model") -> None:
        self.tokens = tokens
        self.pace_s = pace_s
        self.model = model
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                line, _, rest = head.partition(b"\r\n")
                method, path, _ = line.split(b" ", 2)
                lower = rest.lower()
                length = 0
                if b"content-length:" in lower:
                    length = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
                body = await reader.readexactly(length) if length else b""
                close = b"connection: close" in lower
                if method == b"GET":
                    await self._get(writer, path)
                elif method == b"POST" and path.split(b"?")[0] in (b"/v1/chat/completions", b"/v1/completions",
                                                                   b"/chat/completions", b"/completions"):
                    self.requests += 1
                    await self._generate(writer, path, body)
                else:
                    self._json(writer, 404, {"error": {"message": "not found", "type": "not_found_error", "code": 404}})
                await writer.drain()
                if close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    def _json(self, writer: asyncio.StreamWriter, status: int, obj: object) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode()
        reason = b"OK" if status == 200 else b"Error"
        writer.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                     % (status, reason, len(data), data))

    async def _get(self, writer: asyncio.StreamWriter, path: bytes) -> None:
        if path.startswith(b"/v1/models") or path.startswith(b"/models"):
            self._json(writer, 200, {"object": "list", "data": [
                {"id": self.model, "object": "model", "created": 0, "owned_by": "bench", "max_model_len": 65536}]})
        elif path.startswith(b"/health"):
            self._json(writer, 200, {"status": "ok"})
        else:
            self._json(writer, 404, {"error": {"message": "not found", "type": "not_found_error", "code": 404}})

    async def _generate(self, writer: asyncio.StreamWriter, path: bytes, body: bytes) -> None:
        try:
            req = json.loads(body)
        except ValueError:
            self._json(writer, 400, {"error": {"message": "bad json", "type": "BadRequestError", "code": 400}})
            return
        chat = b"chat" in path
        n = req.get("max_tokens") or req.get("max_completion_tokens") or self.tokens
        model = json.dumps(req.get("model") or self.model).encode()
        stream = bool(req.get("stream"))
        usage_wanted = bool((req.get("stream_options") or {}).get("include_usage"))
        loop = asyncio.get_running_loop()
        start = loop.time()
        pace = self.pace_s
        if not stream:
            if pace:
                await asyncio.sleep(n * pace)
            text = "".join(f" t{i}" for i in range(n))
            obj = {"id": "chatcmpl-bench", "object": "chat.completion" if chat else "text_completion", "created": 0,
                   "model": req.get("model") or self.model,
                   "choices": [{"index": 0, "finish_reason": "length",
                                **({"message": {"role": "assistant", "content": text}} if chat else {"text": text})}],
                   "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}}
            self._json(writer, 200, obj)
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        if chat:
            prefix = b'{"id":"%s","object":"chat.completion.chunk","created":0,"model":%s,"choices":[{"index":0,' % (_ID, model)
            writer.write(_chunk(prefix + b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}'))
            token = prefix + b'"delta":{"content":" t%d"},"finish_reason":null}]}'
            finish = prefix + b'"delta":{},"finish_reason":"length"}]}'
        else:
            prefix = b'{"id":"cmpl-bench","object":"text_completion","created":0,"model":%s,"choices":[{"index":0,' % model
            token = prefix + b'"text":" t%d","finish_reason":null}]}'
            finish = prefix + b'"text":"","finish_reason":"length"}]}'
        for i in range(n):
            if pace:
                delay = start + (i + 1) * pace - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                writer.write(_chunk(token % i))
                await writer.drain()
            else:
                writer.write(_chunk(token % i))
        tail = _chunk(finish)
        if usage_wanted:
            tail += _chunk(b'{"id":"%s","object":"chat.completion.chunk","created":0,"model":%s,"choices":[],'
                           b'"usage":{"prompt_tokens":8,"completion_tokens":%d,"total_tokens":%d}}' % (_ID, model, n, n + 8))
        writer.write(tail + _chunk(b"[DONE]") + b"0\r\n\r\n")


def _chunk(data: bytes) -> bytes:
    payload = b"data: " + data + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(payload), payload)


async def serve(host: str, port: int, tokens: int, pace_ms: float) -> None:
    upstream = Upstream(tokens, pace_ms / 1e3)
    server = await asyncio.start_server(upstream.handle, host, port, backlog=4096, limit=1 << 20)
    print(f"bench upstream on http://{host}:{port}: {tokens} tokens, {pace_ms:g} ms apart", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=32, help="tokens per answer when max_tokens is not sent")
    parser.add_argument("--pace-ms", type=float, default=0.0, help="milliseconds between tokens (0: all at once)")
    parser.add_argument("--no-uvloop", action="store_true", help="the stdlib event loop")
    args = parser.parse_args(argv)
    if not args.no_uvloop:
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            pass
    started = time.monotonic()
    try:
        asyncio.run(serve(args.host, args.port, args.tokens, args.pace_ms))
    except KeyboardInterrupt:
        pass
    return 0 if time.monotonic() > started else 1


if __name__ == "__main__":
    sys.exit(main())
