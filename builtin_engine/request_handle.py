"""The consumer's end of a request, and the hand-over of outputs from the step thread.

Outputs of one step go to each event loop in one `loop.call_soon_threadsafe` call, into the
handles' asyncio queues; a handle created outside any event loop (scripts, tests) gets them
through a thread-safe queue instead.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Iterable

from builtin_engine.outputs import RequestOutput

Item = RequestOutput | BaseException  # an exception ends the stream: it is raised to the consumer


class RequestHandle:
    """Iterate it (`async for`, on the loop that created it) or call `get()` (no loop)."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop | None) -> None:
        self.request_id = request_id
        self.loop = loop
        self._async_queue: asyncio.Queue[Item] | None = asyncio.Queue() if loop is not None else None
        self._sync_queue: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self.finished = False  # the last output (or an error) has been consumed

    @classmethod
    def for_current_loop(cls, request_id: str) -> RequestHandle:
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        return cls(request_id, loop)

    def put(self, item: Item) -> None:
        """On the handle's own loop (any thread for a loop-less handle)."""
        if self._async_queue is not None:
            self._async_queue.put_nowait(item)
        else:
            self._sync_queue.put(item)

    @property
    def has_output(self) -> bool:
        """Whether an output is waiting to be consumed."""
        q = self._async_queue
        return not q.empty() if q is not None else not self._sync_queue.empty()

    def __aiter__(self) -> RequestHandle:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        assert self._async_queue is not None, "this handle was created outside an event loop: use get()"
        return self._consume(await self._async_queue.get())

    def get(self, timeout: float | None = None) -> RequestOutput:
        """The next output of a loop-less handle (blocks)."""
        return self._consume(self._sync_queue.get(timeout=timeout))

    def _consume(self, item: Item) -> RequestOutput:
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item


def deliver(items: Iterable[tuple[RequestHandle, Item]]) -> list[RequestHandle]:
    """Hand items to their handles from the step thread; return the handles whose event loop is
    closed (nobody listens any more)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestHandle, Item]]] = {}
    for handle, item in items:
        if handle.loop is None:
            handle.put(item)
        else:
            by_loop.setdefault(handle.loop, []).append((handle, item))
    orphans: list[RequestHandle] = []
    for loop, batch in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, batch)
        except RuntimeError:
            orphans.extend(handle for handle, _ in batch)
    return orphans


def _put_all(batch: list[tuple[RequestHandle, Item]]) -> None:
    for handle, item in batch:
        handle.put(item)
