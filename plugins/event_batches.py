"""Events that arrive together, kept together: a backend whose source delivers several events
at once (a proxy: every SSE event in one read from the upstream's socket) hands its
`generate()` out as `EventBatches`. The gateway's event pump takes the lists whole (one
hand-over per read instead of one per event, and one async-generator layer less); every other
consumer iterates it event by event, as any `generate()`."""

from __future__ import annotations

from collections.abc import AsyncIterator

from plugins.protocol import Event


class EventBatches:
    """An async iterator of events over `batches`, an async iterator of non-empty lists of
    events. `aclose()` closes `batches` (which ends the backend's request)."""

    __slots__ = ("batches", "_pending", "_next")

    def __init__(self, batches: AsyncIterator[list[Event]]) -> None:
        self.batches = batches
        self._pending: list[Event] = []
        self._next = 0

    def __aiter__(self) -> EventBatches:
        return self

    async def __anext__(self) -> Event:
        while self._next >= len(self._pending):
            self._pending = await self.batches.__anext__()
            self._next = 0
        event = self._pending[self._next]
        self._next += 1
        return event

    async def aclose(self) -> None:
        await self.batches.aclose()  # type: ignore[attr-defined]
