"""`StreamFeed`: what `attempts.stream_body` does with each batch of a streamed body's events —
the usage kept, the token marks, the key's accounting, the wire API's bytes — in the request's
task, or pushed from the upstream connection's callback straight to the client (`push`,
`push_text`)."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Protocol

from gateway.errors import ErrorResponse
from gateway.service.accounting import RequestAccounting
from gateway.service.request_timer import RequestTimer, is_token_event
from plugins.contract.errors import SwitchyardError
from plugins.contract.protocol import Event, TextDelta, Usage

# While the HTTP layer sends a streamed body from a request's task (`gateway.http.common.send_sse`,
# the chat exchange): that request cycle's `write_piece`, for the producer of the body's middle
# pieces to write them itself (`gateway.service.attempts.stream_body`); None behind any other
# server.
BODY_WRITER: ContextVar[Callable[[bytes], bool] | None] = ContextVar("switchyard_body_writer", default=None)


class StreamWriter(Protocol):
    """A wire API's streamed body for one request: bytes for each batch of events."""

    def start(self, first: list[Event]) -> bytes:
        """What goes out before the first batch (which it may look at, not consume)."""

    def feed(self, batch: list[Event]) -> bytes: ...

    async def finish(self, usage: Usage) -> bytes:
        """The end of a stream that completed (after whatever must happen before the client
        sees it, e.g. storing the response); raise `SwitchyardError` if the backend left it
        incomplete (a choice never finished)."""

    async def error(self, error: SwitchyardError, payload: ErrorResponse) -> bytes:
        """The end of a stream that failed after it began."""


class StreamFeed:
    """`feed(batch)` is the bytes of a batch. With `write` (the request cycle's `write_piece`),
    it is the `EventPump.next_batch` sink (`sink`) whose `push` writes them to the client itself,
    from outside the task: when `write` refuses (the client reads slowly, or the response is not
    in a state for it), the bytes are kept and lead the next `feed`'s, and `push` says False so
    the task takes over; an error is kept for the next `feed` to raise, as it would have in the
    task. `push_text` is `push` of one plain token, through the writer's `feed_text` when it has
    one."""

    __slots__ = ("_timer", "_accounting", "_writer", "_write", "_feed_text", "usage", "kept", "_error")

    def __init__(self, timer: RequestTimer, accounting: RequestAccounting | None, writer: StreamWriter,
                 write: Callable[[bytes], bool] | None) -> None:
        self._timer = timer
        self._accounting = accounting
        self._writer = writer
        self._write = write
        self._feed_text: Callable[[int, str], bytes] | None = getattr(writer, "feed_text", None)
        self.usage: Usage | None = None
        self.kept = b""  # pushed bytes the client has not been written yet
        self._error: Exception | None = None

    @property
    def sink(self) -> StreamFeed | None:
        """What `EventPump.next_batch` may push to: this, when there is a `write`."""
        return self if self._write is not None else None

    def feed(self, batch: list[Event]) -> bytes:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        tokens = False
        for event in batch:
            if isinstance(event, Usage):
                self.usage = event
            elif not tokens and is_token_event(event):
                tokens = True
        if tokens:
            self._timer.mark_tokens()
        if self._accounting is not None:
            self._accounting.on_events(batch)
        out = self._writer.feed(batch)
        if self.kept:
            out, self.kept = self.kept + out, b""
        return out

    def push(self, batch: list[Event]) -> bool:
        try:
            out = self.feed(batch)
        except Exception as exc:  # never into the connection's callback
            self._error = exc
            return False
        return self._written(out)

    def push_text(self, index: int, text: str) -> bool:
        feed_text = self._feed_text
        if feed_text is None or self._error is not None or self.kept:
            return self.push([TextDelta(text=text, index=index)])
        self._timer.mark_tokens()
        if self._accounting is not None:
            self._accounting.on_text()
        try:
            out = feed_text(index, text)
        except Exception as exc:
            self._error = exc
            return False
        return self._written(out)

    def _written(self, out: bytes) -> bool:
        if not out or self._write(out):  # type: ignore[misc]
            return True
        self.kept = out
        return False
