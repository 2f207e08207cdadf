"""uvicorn's server with the gateway's graceful drain.

On SIGTERM (or SIGINT) uvicorn stops accepting connections and waits for the open ones; the
gateway (`Gateway.begin_drain`) answers any new request on them with 503, lets requests in
flight run for `drain_s`, then ends the rest — streams with an error event and `[DONE]`. A
second signal ends them at once. The process then exits 0: uvicorn would re-raise the signal
after its shutdown and die by it, which process managers count as a crash.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from types import FrameType

import uvicorn

DRAIN_BACKSTOP_S = 5.0  # uvicorn's own graceful timeout is the drain period plus this


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain_s: float) -> None:
        super().__init__(config)
        self.drain_s = drain_s
        self.loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig not in (signal.SIGTERM, signal.SIGINT):
            super().handle_exit(sig, frame)
            return
        self.should_exit = True  # the signal is not recorded: no re-raise after shutdown
        gateway = getattr(self.config.app.state, "gateway", None)
        if gateway is not None and self.loop is not None:
            self.loop.call_soon_threadsafe(gateway.begin_drain, self.drain_s)
