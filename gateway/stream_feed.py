"""`StreamFeed`: what `serving.stream_body` does with each batch of a streamed body's events —
the usage kept, the token marks, the key's accounting, the wire API's bytes — in the request's
task, or pushed from the upstream connection's callback straight to the client (`push`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.request_timer import is_token_event
from plugins.protocol import Event, Usage

if TYPE_CHECKING:
    from gateway.serving import Observed, StreamWriter


class StreamFeed:
    """`feed(batch)` is the bytes of a batch. With `write` (the request cycle's `write_piece`),
    `push` is the `EventPump.next_batch` sink that writes them to the client itself, from
    outside the task: when `write` refuses (the client reads slowly, or the response is not in a
    state for it), the bytes are kept and lead the next `feed`'s, and `push` says False so the
    task takes over; an error is kept for the next `feed` to raise, as it would have in the task."""

    __slots__ = ("_observed", "_writer", "_write", "usage", "kept", "_error")

    def __init__(self, observed: Observed, writer: StreamWriter, write: Callable[[bytes], bool] | None) -> None:
        self._observed = observed
        self._writer = writer
        self._write = write
        self.usage: Usage | None = None
        self.kept = b""  # pushed bytes the client has not been written yet
        self._error: Exception | None = None

    @property
    def push(self) -> Callable[[list[Event]], bool] | None:
        """A new bound method each time: one kept in an attribute would make this object a
        reference cycle, left with all it holds to the cyclic GC."""
        return self._push if self._write is not None else None

    def feed(self, batch: list[Event]) -> bytes:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        observed = self._observed
        tokens = False
        for event in batch:
            if isinstance(event, Usage):
                self.usage = event
            elif not tokens and is_token_event(event):
                tokens = True
        if tokens:
            observed.timer.mark_tokens()
        if observed.accounting is not None:
            observed.accounting.on_events(batch)
        out = self._writer.feed(batch)
        if self.kept:
            out, self.kept = self.kept + out, b""
        return out

    def _push(self, batch: list[Event]) -> bool:
        try:
            out = self.feed(batch)
        except Exception as exc:  # never into the connection's callback
            self._error = exc
            return False
        if not out or self._write(out):  # type: ignore[misc]
            return True
        self.kept = out
        return False
