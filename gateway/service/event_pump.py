"""`EventPump`: a backend's events handed to the request in batches, interruptible by the
request's deadline and the drain."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from plugins.contract.protocol import Event

if TYPE_CHECKING:
    from plugins.proxy.stream import EventSink


class EventPump:
    """Hands the consumer every event of a backend that is ready at once, so that a `Finish`
    yielded right after the last `TextDelta` can ride on the same chunk without holding any
    text back to wait for it.

    A backend whose event iterator has `next_batch()` (the proxies' `UpstreamEvents`) is read
    from the consumer's own task, with no task of its own, and takes a `sink` for the events
    that arrive while the consumer waits (see `next_batch`). Any other iterator runs in a
    task of its own that buffers what it yields.

    `close()` closes the backend's iterator (which aborts the request upstream or in the engine)."""

    def __init__(self, events: AsyncIterator[Event]) -> None:
        self._events = events
        self._buffer: list[Event] = []
        self._error: BaseException | None = None
        self._done = False
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._next: Callable[[EventSink | None], Awaitable[list[Event] | None]] | None = getattr(events, "next_batch", None)
        self._reader: asyncio.Task[object] | None = None  # the task awaiting `_next` now
        self._task = None if self._next is not None else asyncio.get_running_loop().create_task(self._run())

    def interrupt_at(self, when: float, error: BaseException) -> None:
        """`interrupt(error)` at loop time `when` (a request deadline), unless closed first."""
        self._timer = asyncio.get_running_loop().call_at(when, self.interrupt, error)

    def interrupt(self, error: BaseException) -> None:
        """End the stream with `error`: the consumer gets the events already here, then
        `error`; the backend's iterator is cancelled (which aborts its request)."""
        if self._done:
            return
        self._error = error
        self._done = True
        if self._task is not None:
            self._task.cancel()
            self._wake()
        elif self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()  # `next_batch` turns this cancellation into `error`

    async def _run(self) -> None:
        try:
            async for event in self._events:
                self._buffer.append(event)
                self._wake()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the consumer, who raises it
            if not self._done:  # not after `interrupt`, whose error stands
                self._error = exc
        finally:
            self._done = True
            self._wake()

    @property
    def exhausted(self) -> bool:
        """The stream ended without an error and its last batch is out: `next_batch()` would
        return None at once. (A proxy's `UpstreamEvents` says so by its `ended`.)"""
        if self._error is not None:
            return False
        if self._task is None:
            return self._done or getattr(self._events, "ended", False)
        return self._done and not self._buffer

    @property
    def served_by(self) -> str | None:
        """The replica that served, as the backend's iterator says (`ReportsServedBy`); None
        for a backend without replicas."""
        return getattr(self._events, "served_by", None)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_batch(self, sink: EventSink | None = None) -> list[Event] | None:
        """The events ready now (waiting for at least one); None when the stream has ended.
        `sink`: the events that arrive while this waits may be handed to `sink.push(batch)` (or
        `sink.push_text`) instead, outside this task, until it returns False (then this returns, `[]` if nothing else
        came); only a proxy's stream does so, and never its first events, its end or an error."""
        if self._next is not None:
            return await self._next_direct(self._next, sink)
        while not self._buffer:
            if self._done:
                return self._end()
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None
        batch, self._buffer = self._buffer, []
        return batch

    def _end(self) -> None:  # raises the stream's error, if any
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return None

    async def _next_direct(self, next_batch: Callable[[EventSink | None], Awaitable[list[Event] | None]],
                           sink: EventSink | None) -> list[Event] | None:
        if self._done:
            return self._end()
        self._reader = task = asyncio.current_task()
        try:
            batch = await next_batch(sink)
        except asyncio.CancelledError:
            if self._error is not None and task is not None and task.uncancel() == 0:  # interrupted, not cancelled
                return self._end()
            raise
        except BaseException:
            self._done = True
            raise
        finally:
            self._reader = None
        if batch is None:
            self._done = True
        return batch

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._task is None:
            await self._events.aclose()  # type: ignore[attr-defined]
        elif not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
