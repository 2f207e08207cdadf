"""The gateway's HTTP/1.1 server protocol: uvicorn's `httptools` protocol (connections, keep-alive
timeout, flow control, pipelining, `limit_concurrency`, graceful shutdown stay uvicorn's) whose
`POST` to the app's fast path becomes the app's own exchange (`exchange`: the streamed chat
front's `ChatExchange`) instead of an ASGI request cycle; every other request is uvicorn's, with
the response head written with the first body piece (`HeadWithBodyProtocol`). No ASGI scope is
built for a request until one is needed."""

from __future__ import annotations

import contextvars
import urllib.parse
from typing import Any

import httptools

from gateway.http.head_protocol import HeadWithBodyProtocol, ServerExchange, begin_scope


class ExchangeProtocol(HeadWithBodyProtocol):
    """Serves the app's fast path (`path`) as its `exchange` through its `open_exchange` (the
    streamed chat front); an app without one (or one uvicorn wrapped) is served through ASGI only."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.open_exchange = getattr(self.app, "open_exchange", None)
        self.exchange: type[ServerExchange] | None = getattr(self.app, "exchange", None)
        self.chat_path: str | None = getattr(self.app, "path", None) if self.open_exchange and self.exchange else None
        self.running: ServerExchange | None = None  # the exchange whose task runs (maybe not `cycle`: pipelining)

    def on_message_begin(self) -> None:
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self.scope = None  # type: ignore[assignment]  # built in `on_headers_complete` when it is uvicorn's

    def on_headers_complete(self) -> None:
        parser = self.parser
        if (self.chat_path is None or parser.get_method() != b"POST" or parser.should_upgrade()
                or (self.limit_concurrency is not None  # (uvicorn's own cycle answers the 503)
                    and (len(self.connections) >= self.limit_concurrency or len(self.tasks) >= self.limit_concurrency))):
            self._uvicorn_headers_complete()
            return
        target = request_target(self.url, self.root_path)
        if target[0] != self.chat_path:
            self._uvicorn_headers_complete()
            return
        http_version = parser.get_http_version()
        exchange = self.exchange(self, target, http_version, http_version != "1.0" and parser.should_keep_alive())  # type: ignore[call-arg, misc]
        existing, self.cycle = self.cycle, exchange  # type: ignore[assignment]
        if existing is None or existing.response_complete:
            self._start_asgi_task(exchange, None)  # type: ignore[arg-type]
        else:  # pipelined: it waits for the responses before it, as uvicorn's cycles do
            self.flow.pause_reading()
            self.pipeline.appendleft((exchange, None))  # type: ignore[arg-type]

    def _uvicorn_headers_complete(self) -> None:
        self.scope = begin_scope(self, self.headers)  # type: ignore[assignment]
        super().on_headers_complete()

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if type(cycle) is not self.exchange:
            super()._start_asgi_task(cycle, app)
            return
        self.running = cycle
        run = cycle.run(self.open_exchange)  # type: ignore[arg-type]
        if self.config.reset_contextvars:
            task = self.loop.create_task(run, context=contextvars.Context())
        else:
            task = self.loop.create_task(run)
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        # uvicorn tells only the last request read; an exchange answering before a pipelined one is told too
        running = self.running
        if running is not None and running is not self.cycle and not running.response_complete:
            running.disconnected = True
            running.message_event.set()
            if running.on_disconnect is not None:
                running.on_disconnect()


def request_target(url: bytes, root_path: str) -> tuple[str, bytes, bytes]:
    """The request's path, raw path and query string, as uvicorn's protocol reads them."""
    parsed = httptools.parse_url(url)
    raw_path = parsed.path
    path = raw_path.decode("ascii")
    if "%" in path:
        path = urllib.parse.unquote(path)
    return root_path + path, root_path.encode("ascii") + raw_path, parsed.query or b""
