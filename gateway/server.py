"""uvicorn's server with the gateway's graceful drain, serving one process (`serve`).

On SIGTERM (or SIGINT) uvicorn stops accepting connections and waits for the open ones; the
gateway (`Gateway.begin_drain`) answers any new request on them with 503, lets requests in
flight run for `drain_s`, then ends the rest — streams with an error event and `[DONE]`. A
second signal ends them at once. The process then exits 0: uvicorn would re-raise the signal
after its shutdown and die by it, which process managers count as a crash.

With `[server] workers` > 1 each worker process runs `serve` on the socket its parent handed
it (`gateway.worker_pool`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn

if TYPE_CHECKING:
    from gateway.config import Config

DRAIN_BACKSTOP_S = 5.0  # uvicorn's own graceful timeout is the drain period plus this
# young objects the cyclic GC lets pile up before a collection (CPython's default: 700); see tune_gc
GC_YOUNG_THRESHOLD = 100_000


def serve(config: Config, *, host: str, port: int, drain_s: float, sockets: list[socket.socket] | None = None,
          worker: int | None = None, on_ready: Callable[[], None] | None = None) -> None:
    """Serve `config` in this process until a signal; bind `host:port` unless given `sockets`.
    `worker`: this process's number among the server's workers (the `x-switchyard-worker` header);
    `on_ready` is called once it accepts requests."""
    from gateway.app import create_app
    from gateway.chat_api.streamed import StreamedChatFront
    from gateway.http.exchange_protocol import ExchangeProtocol
    from gateway.keys.keyring import Redactor, install_log_redaction

    where = "" if worker is None else f" worker {worker}"
    logging.basicConfig(level=config.server.log_level.upper(),
                        format=f"%(asctime)s %(levelname)s{where} %(name)s: %(message)s")
    app = create_app(config, worker=worker)
    uv_config = uvicorn.Config(
        StreamedChatFront(app, config.server.max_body_bytes),
        host=host,
        port=port,
        loop="uvloop",
        http=ExchangeProtocol,  # uvicorn's httptools protocol; the streamed chat route our own exchange
        log_level=config.server.log_level,
        access_log=False,
        proxy_headers=False,  # nothing here reads the client's address: skip X-Forwarded-* parsing per request
        # a backstop only: the gateway itself ends every request at `drain_s`
        timeout_graceful_shutdown=drain_s + DRAIN_BACKSTOP_S,
    )
    install_log_redaction(Redactor.from_config(config))  # after uvicorn has set up its handlers
    DrainingServer(uv_config, drain_s, on_ready).run(sockets=sockets)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain_s: float, on_ready: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.drain_s = drain_s
        self.on_ready = on_ready
        self.loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)
        tune_gc()
        if self.on_ready is not None and self.started:
            self.on_ready()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig not in (signal.SIGTERM, signal.SIGINT):
            super().handle_exit(sig, frame)
            return
        self.should_exit = True  # the signal is not recorded: no re-raise after shutdown
        gateway = getattr(self.config.app.state, "gateway", None)
        if gateway is not None and self.loop is not None:
            self.loop.call_soon_threadsafe(gateway.begin_drain, self.drain_s)


def tune_gc() -> None:
    """Once the app is up: the objects alive now (modules, the app, the plugins: most of the
    heap) leave the cyclic GC's generations for good (`gc.freeze`), and the young generation is
    collected every GC_YOUNG_THRESHOLD allocations instead of 700. Every streamed request
    allocates hundreds of containers (tasks, frames, events, cancelled watchers' tracebacks);
    with the defaults the collector ran ~200 times a second at 256 streams and took ~15% of the
    process's CPU, rescanning the same long-lived objects each time. Garbage without cycles is
    still freed at once by reference counting. The count is of objects allocated and not yet
    freed, so it grows with what is alive: 256 streams hold ~40,000, and at 10,000 every
    collection rescanned them (~8% of the CPU, none of it finding garbage); 100,000 leaves room
    for that and bounds the cyclic garbage left waiting (error tracebacks) to a few MB."""
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)

