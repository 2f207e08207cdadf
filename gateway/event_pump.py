"""A backend's events run in a task of their own and handed over in batches (`EventPump`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from plugins.event_batches import EventBatches
from plugins.protocol import Event


class EventPump:
    """Runs a backend's event iterator in its own task and hands the consumer every event that
    is ready at once, so that a `Finish` yielded right after the last `TextDelta` can ride on
    the same chunk without holding any text back to wait for it.

    `close()` cancels the task, which closes the backend's iterator (its `finally` aborts the
    request upstream or in the engine)."""

    def __init__(self, events: AsyncIterator[Event]) -> None:
        self._events = events
        self._buffer: list[Event] = []
        self._error: BaseException | None = None
        self._done = False
        self._waiter: asyncio.Future[None] | None = None
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._timer: asyncio.TimerHandle | None = None

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
        self._task.cancel()
        self._wake()

    async def _run(self) -> None:
        try:
            if type(self._events) is EventBatches:
                async for batch in self._events.batches:
                    self._buffer += batch
                    self._wake()
            else:
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

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_batch(self) -> list[Event] | None:
        """The events ready now (waiting for at least one); None when the stream has ended."""
        while not self._buffer:
            if self._done:
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None
        batch, self._buffer = self._buffer, []
        return batch

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
