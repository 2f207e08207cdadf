"""`ChatExchange`: one `POST /v1/chat/completions` on our server protocol
(`gateway.http.exchange_protocol`), served without ASGI: no scope, no messages, no uvicorn
request cycle.

The exchange reads the request's body; the streamed chat front (`open_exchange`) decides. A
stream it serves is written here straight to the connection: the head uvicorn would write (its
`date`/`server` headers, `transfer-encoding: chunked`, `connection: close` when the connection
does not stay open) with the first piece, the middle pieces chunk-framed (or pushed from the
upstream's callbacks through `write_piece`), the last piece with the chunked body's end; then
the connection goes on to its next request as uvicorn's cycle does (`on_response_complete`).
The stream waits while the transport has paused writing (a slow reader loses nothing), and the
connection's loss calls `on_disconnect` back. Anything the front does not serve itself goes on
as a uvicorn request cycle (`to_asgi`), the body read so far given to it as uvicorn would.

Fewer coroutine levels on the stream's task path: each wake-up resumes `run` → the body
generator → the upstream pump, where the ASGI cycle resumed eight levels.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from gateway.http.head_protocol import ServerExchange, _HeadWithBodyCycle, begin_scope
from gateway.service.attempts import LastPiece
from gateway.service.stream_feed import BODY_WRITER

if TYPE_CHECKING:
    from gateway.http.common import DisconnectWatch
    from gateway.http.exchange_protocol import ExchangeProtocol

# what the front gives a stream it serves: its header fields, its body, the client's disconnect watch
Opened = tuple[list[tuple[bytes, bytes]], AsyncIterator[bytes], "DisconnectWatch"]
OpenExchange = Callable[["ChatExchange"], Awaitable[Opened | None]]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]

CHUNKED = b"transfer-encoding: chunked\r\n\r\n"
CLOSE = b"connection: close\r\n"
END = b"0\r\n\r\n"


class ChatExchange(ServerExchange):
    """The server side of one request. The protocol reads and writes the attributes uvicorn's
    request cycle has (`body`, `more_body`, `message_event`, `disconnected`,
    `response_complete`, `keep_alive`) and calls `on_disconnect` when the client goes away."""

    __slots__ = ("_protocol", "transport", "flow", "headers", "_target", "http_version", "keep_alive",
                 "expect_100_continue", "body", "more_body", "message_event", "disconnected",
                 "response_complete", "on_disconnect", "_head", "_started")

    def __init__(self, protocol: ExchangeProtocol, target: tuple[str, bytes, bytes], http_version: str,
                 keep_alive: bool) -> None:
        self._protocol = protocol
        self.transport = protocol.transport
        self.flow = protocol.flow
        self.headers = protocol.headers  # (lower-case name, value), as uvicorn gives them to ASGI
        self._target = target  # the path, the raw path, the query string
        self.http_version = http_version
        self.keep_alive = keep_alive
        self.expect_100_continue = protocol.expect_100_continue
        self.body = bytearray()
        self.more_body = True
        self.message_event = asyncio.Event()
        self.disconnected = False
        self.response_complete = False
        self.on_disconnect: Callable[[], None] | None = None
        self._head = b""  # the response head, until it goes out with the first piece
        self._started = False  # the response is under way (uvicorn's `response_started`)

    async def read_body(self) -> bytes | None:
        """The whole request body (None: the client left first); kept for `to_asgi` to give on."""
        if self.expect_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.expect_100_continue = False
        self.flow.resume_reading()
        while self.more_body and not self.disconnected:
            await self.message_event.wait()
            self.message_event.clear()
            self.flow.resume_reading()
        return None if self.disconnected else bytes(self.body)

    async def receive(self) -> dict[str, Any]:
        """ASGI's `receive` once the body is read: the disconnect (`DisconnectWatch` finds the
        exchange behind it and is called back instead)."""
        while not (self.disconnected or self.response_complete):
            await self.message_event.wait()
            self.message_event.clear()
        return {"type": "http.disconnect"}

    async def to_asgi(self, app: ASGIApp) -> None:
        """The rest of the exchange as our protocol's uvicorn request cycle running `app`, with
        the scope uvicorn builds and the body read so far still to be received."""
        await self._cycle().run_asgi(app)

    def _cycle(self) -> _HeadWithBodyCycle:
        protocol = self._protocol
        cycle = _HeadWithBodyCycle(
            scope=self.scope(), transport=self.transport, flow=self.flow, logger=protocol.logger,
            access_logger=protocol.access_logger, access_log=protocol.access_log,
            default_headers=protocol.server_state.default_headers, message_event=self.message_event,
            expect_100_continue=self.expect_100_continue, keep_alive=self.keep_alive,
            on_response=protocol.on_response_complete)  # type: ignore[arg-type]
        cycle.body, cycle.more_body, cycle.disconnected = self.body, self.more_body, self.disconnected
        if protocol.cycle is self:  # what the connection reads and loses from now on is the cycle's
            protocol.cycle = cycle
        self.message_event.set()  # uvicorn's `receive` waits for it before each message
        return cycle

    def scope(self) -> dict[str, Any]:
        """The ASGI scope uvicorn's protocol builds for this request."""
        path, raw_path, query = self._target
        scope = begin_scope(self._protocol, self.headers)
        scope.update(http_version=self.http_version, method="POST", path=path, raw_path=raw_path, query_string=query)
        return scope

    async def run(self, open_exchange: OpenExchange) -> None:
        """The exchange's task: the front decides, then a stream it serves is written here."""
        try:
            opened = await open_exchange(self)
            if opened is None:
                return
            fields, pieces, watch = opened
            self._head = self._start(fields)
            task = watch.arm()
            BODY_WRITER.set(self.write_piece)  # (the task's own context) `stream_body` pushes the middle itself
            flow = self.flow
            try:
                async for piece in pieces:
                    if flow.write_paused and not self.disconnected:
                        await flow.drain()  # a slow reader: the stream waits for it
                    if type(piece) is LastPiece:
                        self._end(piece)
                        await pieces.aclose()  # type: ignore[attr-defined]
                        return
                    self._write(b"%x\r\n%s\r\n" % (len(piece), piece) if piece else b"")
                self._end(b"")
            except asyncio.CancelledError:
                if not watch.absorbs(task):
                    raise
            finally:
                watch.close()
        except BaseException as exc:  # as uvicorn's `run_asgi` ends an application that raised
            await self._failed(exc)

    def write_piece(self, body: bytes) -> bool:
        """A middle piece written at once, when nothing has to wait (the head is out, no
        flow-control pause, the client still here); False: the task writes it."""
        if self._head or not body or self.response_complete or self.disconnected or self.flow.write_paused:
            return False
        self.transport.write(b"%x\r\n%s\r\n" % (len(body), body))
        return True

    def _start(self, fields: list[tuple[bytes, bytes]]) -> bytes:
        """The head uvicorn writes for a 200 with `fields` (the route's own: never framing or
        `connection` headers) after the server's default headers."""
        self._started = True
        protocol = self._protocol
        names = b"".join(name for name, _ in fields)
        values = b"".join(value for _, value in fields)
        if HEADER_RE.search(names):  # (one search of all of them finds what uvicorn's per header finds)
            raise RuntimeError("Invalid HTTP header name.")
        if HEADER_VALUE_RE.search(values):
            raise RuntimeError("Invalid HTTP header value.")
        if protocol.access_log:
            scope = self.scope()
            protocol.access_logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(scope), "POST",  # type: ignore[arg-type]
                                        get_path_with_query_string(scope), self.http_version, 200)  # type: ignore[arg-type]
        lines = [STATUS_LINE[200]]
        for name, value in (*protocol.server_state.default_headers, *fields):
            lines += (name, b": ", value, b"\r\n")
        if not self.keep_alive:
            lines.append(CLOSE)
        lines.append(CHUNKED)
        return b"".join(lines)

    def _write(self, data: bytes) -> None:
        if self.disconnected:  # (uvicorn's `send` drops it too)
            return
        if self._head:
            data, self._head = self._head + data, b""
        if data:
            self.transport.write(data)

    def _end(self, last: bytes) -> None:
        """The last piece and the chunked body's end in one write; the connection then goes
        on to its next request, or closes."""
        if self.disconnected:
            return
        self._write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(last), last) if last else END)
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self._protocol.on_response_complete()

    async def _failed(self, exc: BaseException) -> None:
        self._protocol.logger.error("Exception in ASGI application\n", exc_info=exc)
        if not self._started:
            await self._cycle().send_500_response()
        elif not self.transport.is_closing():
            if self._head:  # the head was due: it goes out before the connection closes, as before
                self.transport.write(self._head)
            self.transport.close()
