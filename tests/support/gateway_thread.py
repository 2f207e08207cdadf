"""A real gateway (uvicorn, loopback HTTP) running in a thread of the test process, so a test
can look inside it between requests: the event loop's tasks, each proxy backend's connection
pool. Requests still go over real sockets, from ordinary clients."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from gateway.app import create_app
from gateway.chat_api.streamed import StreamedChatFront
from gateway.config import parse_config
from gateway.http.exchange_protocol import ExchangeProtocol
from gateway.server import DrainingServer
from gateway.service.gateway import Gateway
from tests.support.server import free_port


class GatewayThread:
    """Served as `switchyard serve` serves (the streamed chat front, our uvicorn protocol), or
    with `plain`, as the bare Litestar app on uvicorn's own protocol (no direct body writes)."""

    def __init__(self, config_text: str, *, drain_s: float = 2.0, plain: bool = False) -> None:
        self.config = parse_config(config_text, "<test>")
        self.app = create_app(self.config)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        served: Any = self.app if plain else StreamedChatFront(self.app, self.config.server.max_body_bytes)
        uv = uvicorn.Config(served, host="127.0.0.1", port=self.port, loop="asyncio",
                            http="httptools" if plain else ExchangeProtocol,
                            log_level="warning", access_log=False, proxy_headers=False,
                            timeout_graceful_shutdown=drain_s + 5)
        self.server = DrainingServer(uv, drain_s)
        self.thread = threading.Thread(target=self.server.run, name="gateway", daemon=True)

    running: set[GatewayThread] = set()  # (their pools' idle connections are open upstream)

    def __enter__(self) -> GatewayThread:
        GatewayThread.running.add(self)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        GatewayThread.running.discard(self)
        self.server.should_exit = True
        self.thread.join(timeout=30)

    @property
    def gateway(self) -> Gateway:
        return self.app.state.gateway

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the gateway's event loop and return its result."""
        assert self.server.loop is not None

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.server.loop).result(timeout=10)

    def task_names(self) -> list[str]:
        """Every task alive on the gateway's loop (but the one asking)."""

        def names() -> list[str]:
            me = asyncio.current_task()
            return sorted(_describe(t) for t in asyncio.all_tasks() if t is not me)

        return self.call(names)

    def pools(self) -> dict[str, tuple[int, int]]:
        """Per proxy backend: (idle, busy) connections in its upstream pool."""

        def count() -> dict[str, tuple[int, int]]:
            out = {}
            for name, backend in self.gateway.backends.items():
                client = getattr(backend, "client", None)
                if client is None:
                    continue
                out[name] = (client.idle_connections, client.busy_connections)
            return out

        return self.call(count)


def _describe(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    return getattr(coro, "__qualname__", repr(coro))
