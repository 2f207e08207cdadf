"""uvicorn's httptools protocol, writing a response's head together with its first body piece.

uvicorn writes the head (`http.response.start`) and every body piece with a socket write of
its own. A streamed answer's head is sent right before its first events, and a JSON answer's
right before its body, so they can share one write: one system call (and one TCP segment to
the client) less per response, a few percent of the gateway's CPU per streamed request. The
bytes on the wire are the same. uvicorn still formats both (its `send` runs unchanged against
a transport that collects what it writes).

Two more per-request savings ride on the same request cycle: the middle pieces of a streamed
body are written straight to the transport (`write_piece`), and the cycle tells the request's
disconnect watch when the connection is lost (`on_disconnect`), so no task waits for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

_send = RequestResponseCycle.send


class _Collect:
    """Stands in for the transport during one `send`: keeps what it writes (and a close)."""

    __slots__ = ("data", "closed", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.data: list[bytes] = []
        self.closed = False
        self._transport = transport

    def write(self, data: bytes) -> None:
        self.data.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self._transport.is_closing()


class ServerExchange:
    """A request's server side that calls `on_disconnect` back when its client goes away and
    writes a streamed body's middle pieces with `write_piece` (see `exchange_of`)."""

    __slots__ = ()


class _HeadWithBodyCycle(RequestResponseCycle, ServerExchange):
    """A request cycle whose response head waits for the first body piece (or the end of the
    exchange) to go out with it."""

    head: bytes = b""  # the response head not written yet
    on_disconnect: Callable[[], None] | None = None  # called when the client goes away mid-exchange

    def write_piece(self, body: bytes) -> bool:
        """A body piece that is not the last, written at once when uvicorn's `send` would do
        nothing else (the head is out, chunked, no flow-control wait, client still here): the
        same bytes without a message dict and two coroutines per piece. False: use `send`."""
        if (self.head or not body or not self.response_started or self.response_complete or self.disconnected
                or self.chunked_encoding is not True or self.flow.write_paused):
            return False
        self.transport.write(b"%x\r\n%s\r\n" % (len(body), body))
        return True

    async def send(self, message: Any) -> None:
        if self.response_started and not self.head:  # the head is out: uvicorn's send as it is
            await _send(self, message)
            return
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()  # here, so that uvicorn's send below runs without a wait
        transport = self.transport
        collect = _Collect(transport)
        self.transport = collect  # type: ignore[assignment]
        try:
            await _send(self, message)
        finally:
            self.transport = transport
        data = b"".join(collect.data)
        if message["type"] == "http.response.start":
            self.head = data
            return
        data, self.head = self.head + data, b""
        if data:
            transport.write(data)
        if collect.closed:
            transport.close()

    async def run_asgi(self, app: Any) -> None:
        async def app_then_head(scope: Any, receive: Any, send: Any) -> None:
            try:
                await app(scope, receive, send)
            finally:  # an app that sent a head and no body: the head goes out before uvicorn ends the exchange
                head, self.head = self.head, b""
                if head and not self.transport.is_closing():
                    self.transport.write(head)

        await super().run_asgi(app_then_head)


class HeadWithBodyProtocol(HttpToolsProtocol):
    """uvicorn's `httptools` protocol with `_HeadWithBodyCycle` request cycles."""

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        cycle.__class__ = _HeadWithBodyCycle  # same attributes; only `send` and `run_asgi` differ
        super()._start_asgi_task(cycle, app)

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = self.cycle
        super().connection_lost(exc)
        # (a pipelined cycle not started yet is still uvicorn's own class: no callback)
        on_disconnect = getattr(cycle, "on_disconnect", None)
        if on_disconnect is not None and cycle.disconnected:  # type: ignore[union-attr]
            on_disconnect()


def begin_scope(protocol: HttpToolsProtocol, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """The ASGI scope uvicorn's `on_message_begin` builds for a request on `protocol`, before
    its method, path and HTTP version are known."""
    return {
        "type": "http",
        "asgi": {"version": protocol.asgi_version, "spec_version": "2.3"},
        "http_version": "1.1",
        "server": protocol.server,
        "client": protocol.client,
        "scheme": protocol.scheme,
        "root_path": protocol.root_path,
        "headers": headers,
        "state": protocol.app_state.copy(),
    }


def exchange_of(channel: Any) -> Any:
    """The `ServerExchange` behind an ASGI `receive` or `send` that is its own bound method (none
    behind a wrapper: then the ASGI messages are the only way)."""
    exchange = getattr(channel, "__self__", None)
    return exchange if isinstance(exchange, ServerExchange) else None
