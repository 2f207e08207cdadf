"""One proxied generation as batches of events, read in the consumer's own task.

`UpstreamEvents` is what `ProxyBackend.stream_upstream` returns. Its `next_batch()` waits for the
upstream's next body bytes (everything that arrived since the last call, joined), parses their
SSE events and normalizes them into one list of protocol events. The gateway's `EventPump`
calls it directly from the request's task: no pump task, its future and three async-generator
layers per upstream read. Reads that arrive while the request's task is busy, or in the loop
turn `http1` lets pass before it wakes a reader, are joined into one batch, so one client write
carries them all (A/B at 256 streams: 0.705 -> 0.655 s of gateway CPU per 1,000 requests).

With a `sink` (`next_batch(sink)`), the stream's plain middle is relayed without the task: while
it waits, each piece (the reads the task would have joined) is parsed, normalized and handed to
`sink.push` from the connection's loop callback (`http1.Response.next_piece`'s `on_piece`), with
no future, task step or frame chain per piece (A/B at 256 streams: 0.789 -> 0.762); a piece that
is one plain token (almost every piece) goes to `sink.push_text` as its index and text, with no
event list or generic normalizing on the way (`StreamNormalizer.plain_token`). Anything else
(a piece that is not whole one-line `data:` events, the end of the stream, a normalizer error)
stops the pushing and is returned by the waiting call exactly as without a sink; so does a
sink's False (the caller then gets `[]`).

It is also an ordinary async iterator of events (`async for`, `aclose()`), for every other
consumer. Like the async generator it replaces: a failure before the first event is raised
before any event; events parsed before a malformed one still come out, then the error; any
exception (a cancellation too) ends it and closes the upstream response, which cancels the
request upstream. Its `served_by` names the replica the request went to, the attempt's outcome
the gateway logs and traces (`plugins.contract.protocol.ReportsServedBy`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from plugins.contract.errors import UpstreamError
from plugins.contract.protocol import Event, RequestSpec
from plugins.fleet.replica import Replica
from plugins.proxy.normalize import StreamNormalizer
from plugins.proxy.upstream import BodyPieces, Upstream
from plugins.transport import http1
from plugins.transport.sse import SSEParser

_json_decode = msgspec.json.Decoder().decode
_json_encode = msgspec.json.Encoder().encode


class EventSink(Protocol):
    """Where `next_batch(sink)` pushes the events that arrive while it waits; False from either
    method: it takes no more (control goes back to the task)."""

    def push(self, events: list[Event]) -> bool: ...

    def push_text(self, index: int, text: str) -> bool:
        """`push([TextDelta(text=text, index=index)])`: a plain token, without the event and list."""


class Forwarder(Protocol):
    """What `UpstreamEvents` asks of the backend that forwards the request
    (`plugins.proxy.backend.ProxyBackend`): its upstream, and the request in the upstream's terms."""

    upstream: Upstream

    def build_body(self, spec: RequestSpec) -> dict[str, Any]: ...

    def request_headers(self, spec: RequestSpec) -> dict[str, str]: ...

    def content_calls(self, spec: RequestSpec) -> Callable[[], Any] | None: ...


class UpstreamEvents:
    __slots__ = ("_backend", "_upstream", "_spec", "_tried", "_replica", "_response", "_body", "_norm", "_parser",
                 "_pending", "_ended", "_closed", "_unread", "_sink", "_held")

    def __init__(self, backend: Forwarder, spec: RequestSpec) -> None:
        self._backend = backend
        self._upstream = backend.upstream
        self._spec = spec
        self._tried: list[Replica] = []  # the replicas the request was sent to, in order
        self._replica: Replica | None = None
        self._response: http1.Response | None = None
        self._body: BodyPieces | None = None
        self._norm: StreamNormalizer | None = None
        self._parser = SSEParser()
        self._pending: Exception | None = None  # raised by the next call, after the events before it
        self._ended = False
        self._closed = False
        self._unread: list[Event] = []  # what `__anext__` has not handed out yet
        self._sink: EventSink | None = None
        self._held: bytes | list[Event] | Exception | None = None  # what stopped the pushing

    async def next_batch(self, sink: EventSink | None = None) -> list[Event] | None:
        """The events of the next upstream read(s), at least one (waiting for them); None once
        the stream has ended (its last batch ends with the `Usage`). With `sink`, the plain
        pieces that arrive while this waits go to it (see above); `[]` when it returned False."""
        try:
            if self._pending is not None:
                error, self._pending = self._pending, None
                raise error
            if self._ended:
                return None
            if self._response is None:
                events = await self._start()
                if events is not None:
                    return events
            return await self._read(sink)
        except BaseException as exc:
            await self._close(exc)
            raise

    @property
    def ended(self) -> bool:
        """The last batch (with the usage) is out and no error waits: `next_batch()` returns None."""
        return self._ended and self._pending is None

    @property
    def served_by(self) -> str | None:
        """The replica (its base URL) the request went to; after a failure before the first
        byte, the one tried last; None while none was tried."""
        return self._tried[-1].url if self._tried else None

    async def _start(self) -> list[Event] | None:
        """Send the request; for an answer that is not SSE (one JSON object), all its events."""
        backend, upstream, spec = self._backend, self._upstream, self._spec
        body = backend.build_body(spec)  # translation errors: 400 before anything is sent
        path = "/v1/chat/completions" if spec.kind == "chat" else "/v1/completions"
        self._replica, self._response, deadline = await upstream.open(spec, path, _json_encode(body),
                                                                       backend.request_headers(spec), self._tried)
        self._body = BodyPieces(upstream, self._response, deadline)
        self._norm = StreamNormalizer(kind=spec.kind, n=spec.sampling.n, backend=upstream.name, spec=spec,
                                      content_calls=backend.content_calls(spec))
        ctype = self._response.header("content-type")
        if "text/event-stream" in ctype:
            return None
        raw = await upstream.read_capped(self._response, deadline, limit=None)
        try:
            obj = _json_decode(raw)
        except msgspec.DecodeError:
            raise UpstreamError(f"Backend `{upstream.name}` answered with {ctype or 'no content type'}, "
                                "neither SSE nor JSON.", kind="bad_gateway") from None
        events = self._norm.feed_response(obj if isinstance(obj, dict) else {})
        return await self._end(events)

    async def _read(self, sink: EventSink | None) -> list[Event]:
        body = self._body
        assert body is not None
        self._sink = sink
        while True:
            # (a bound method per wait: one kept in an attribute would make this object a reference
            # cycle, left with all it holds to the cyclic GC)
            piece = await body.next(self._push if sink is not None else None)
            if piece is None:
                return await self._end([])
            if piece:
                events = self._events_of(piece)
            else:  # pushing stopped
                held, self._held = self._held, None
                if held is None:
                    return []  # the sink asked for control
                if isinstance(held, Exception):
                    raise held
                events = self._events_of(held) if isinstance(held, bytes) else held
            if self._norm.done:  # type: ignore[union-attr]
                if not self._response.complete:  # type: ignore[union-attr]
                    await self._upstream.drain(self._response)  # type: ignore[arg-type]
                return await self._end(events)
            if events:
                return events

    def _events_of(self, piece: bytes) -> list[Event]:
        parser = self._parser
        datas = parser.whole_data(piece)
        if datas is None:
            datas = [sse.data for sse in parser.feed(piece) if sse.event == "message" or sse.event == "error"]
        return self._normalized(datas)

    def _normalized(self, datas: list[str] | list[bytes]) -> list[Event]:
        """The events of `datas`, up to the end of the stream (`norm.done`); a failure after some
        events waits in `_pending`, a failure before any is raised."""
        norm = self._norm
        assert norm is not None
        events: list[Event] = []
        try:
            for data in datas:
                events += norm.feed_data(data)
                if norm.done:
                    break
        except Exception as exc:
            if not events:
                raise
            self._pending = exc
        return events

    def _push(self, piece: bytes) -> bool:
        """`on_piece` while `_read` waits with a sink: a plain piece's events go to the sink; any
        other piece is held for `_read` (as its events, its error, or unread) and ends the push."""
        self._body.arrived()  # type: ignore[union-attr]
        data = self._parser.one_data(piece)
        if data is not None and (token := self._norm.plain_token(data)) is not None:  # type: ignore[union-attr]
            return self._sink.push_text(*token)  # type: ignore[union-attr]
        datas = self._parser.whole_data(piece)
        if datas is None:
            self._held = piece
            return False
        try:
            events = self._normalized(datas)
        except Exception as exc:
            self._held = exc
            return False
        if self._norm.done or self._pending is not None:  # type: ignore[union-attr]
            self._held = events
            return False
        return not events or self._sink.push(events)  # type: ignore[union-attr]

    async def _end(self, events: list[Event]) -> list[Event]:
        """The stream is complete: `events` and the usage are its last batch."""
        try:
            events.append(self._norm.finish())  # type: ignore[union-attr]
        except Exception as exc:
            if not events:
                raise
            self._pending = exc
            return events
        self._ended = True
        await self._close(None)
        return events

    async def _close(self, error: BaseException | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._ended = True
        response = self._response
        if response is None:
            return  # never sent (or `open` failed, which told the fleet itself)
        await self._upstream.release(self._replica, response, self._spec, error)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        """Stop: the upstream response is closed (the request cancelled upstream) if it has not
        ended."""
        self._pending = None
        self._unread = []
        await self._close(asyncio.CancelledError())

    def __aiter__(self) -> UpstreamEvents:
        return self

    async def __anext__(self) -> Event:
        while not self._unread:
            batch = await self.next_batch()
            if batch is None:
                raise StopAsyncIteration
            self._unread = batch
        return self._unread.pop(0)

