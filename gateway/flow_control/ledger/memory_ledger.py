"""The ledger of one gateway process: the algorithm of `fair_order`, on plain lists.

Each band keeps its entries twice, sorted: by `(tag, id)` to serve the head, and by
`(entered, id)` — when the entry came into the band — to age the oldest. Queues are bounded
(`max_queue`), so a sorted list's insertion, a C-speed move, beats a tree here. Nothing awaits
inside a step: each is atomic on the event loop, and a grant with room and nothing waiting is a
few dictionary operations. The steps are plain methods (`*_now`), which `FlowQueue` calls
inline — no coroutine, no task — beside the `Ledger` protocol's async ones; they take the
capacity as a callable, read only when the step needs it (a release with nobody waiting does
not).
"""

from __future__ import annotations

import time
from bisect import bisect_left, insort
from collections.abc import Callable
from dataclasses import dataclass

from gateway.flow_control.ledger.base import Arrival, Entry
from gateway.flow_control.ledger.fair_order import finish_tag, start_tag

PRUNE_TENANTS_AT = 4096  # past this many remembered tenants, forget those whose tags V has passed


@dataclass(slots=True)
class _Waiting:
    tag: float
    entered: float  # when it came into its present band
    band: int
    cost: int


class MemoryLedger:
    def __init__(self, num_bands: int, aging_s: float | None, *, clock: Callable[[], float] = time.monotonic,
                 owner: str = "local") -> None:
        self.owner = owner
        self.num_bands = num_bands
        self.aging_s = aging_s
        self.clock = clock
        self.vclock = 0.0
        self.finish: dict[str, float] = {}  # tenant -> finish tag of its last admitted request
        self.running: set[str] = set()
        self._waiting: dict[str, _Waiting] = {}
        self._by_tag: list[list[tuple[float, str]]] = [[] for _ in range(num_bands)]
        self._by_entered: list[list[tuple[float, str]]] = [[] for _ in range(num_bands)]
        self._band_cost = [0] * num_bands

    def describe(self) -> str:
        return "in-process (this gateway process only)"

    async def close(self) -> None:
        pass

    async def waiting(self) -> int:
        return len(self._waiting)

    def band_of(self, entry_id: str) -> int | None:
        """The band a waiting entry is in now (after aging); None when it does not wait."""
        waiting = self._waiting.get(entry_id)
        return None if waiting is None else waiting.band

    # -- the steps ------------------------------------------------------------------------------

    async def arrive(self, entry: Entry, *, capacity: int, max_queue: int, max_ahead: int | None) -> Arrival:
        return self.arrive_now(entry, lambda: capacity, max_queue, max_ahead)

    async def dispatch(self, capacity: int) -> tuple[str, ...]:
        return self.dispatch_now(lambda: capacity)

    async def release(self, entry_id: str, capacity: int) -> tuple[str, ...]:
        return self.release_now(entry_id, lambda: capacity)

    async def withdraw(self, entry_id: str, capacity: int) -> tuple[str, ...]:
        return self.withdraw_now(entry_id, lambda: capacity)

    def arrive_now(self, entry: Entry, slots: Callable[[], int], max_queue: int, max_ahead: int | None) -> Arrival:
        woken = self.dispatch_now(slots) if self._waiting else ()
        start = start_tag(self.vclock, self.finish.get(entry.tenant))
        if not self._waiting and len(self.running) < slots():
            self._remember(entry, start)
            self.vclock = start
            self.running.add(entry.id)
            return Arrival("granted", 0, woken)
        if len(self._waiting) >= max_queue:
            return Arrival("queue_full", sum(self._band_cost), woken)
        ahead = self._ahead(entry, start)
        if max_ahead is not None and ahead > max_ahead:
            return Arrival("slo", ahead, woken)
        self._remember(entry, start)
        self._insert(entry.id, _Waiting(start, self.clock(), entry.band, entry.cost))
        return Arrival("queued", ahead, woken)

    def release_now(self, entry_id: str, slots: Callable[[], int]) -> tuple[str, ...]:
        self.running.discard(entry_id)
        return self.dispatch_now(slots)

    def withdraw_now(self, entry_id: str, slots: Callable[[], int]) -> tuple[str, ...]:
        waiting = self._waiting.get(entry_id)
        if waiting is not None:
            self._remove(entry_id, waiting)
        self.running.discard(entry_id)
        return self.dispatch_now(slots)

    def dispatch_now(self, slots: Callable[[], int]) -> tuple[str, ...]:
        if not self._waiting:
            return ()
        self._age()
        capacity = slots()
        woken: list[str] = []
        while len(self.running) < capacity and self._waiting:
            band = next(b for b, entries in enumerate(self._by_tag) if entries)
            tag, entry_id = self._by_tag[band][0]
            self._remove(entry_id, self._waiting[entry_id])
            if tag > self.vclock:
                self.vclock = tag
            self.running.add(entry_id)
            woken.append(entry_id)
        return tuple(woken)

    # -- inside a step ----------------------------------------------------------------------------

    def _age(self) -> None:
        """Move each entry that has waited `aging_s` in its band one band up, highest band
        first, so that one that has waited several periods climbs several bands."""
        if self.aging_s is None:
            return
        due = self.clock() - self.aging_s
        for band in range(self.num_bands - 1, 0, -1):
            entered = self._by_entered[band]
            while entered and entered[0][0] <= due:
                _, entry_id = entered[0]
                waiting = self._waiting[entry_id]
                self._remove(entry_id, waiting)
                waiting.band, waiting.entered = band - 1, waiting.entered + self.aging_s
                self._insert(entry_id, waiting)

    def _ahead(self, entry: Entry, start: float) -> int:
        """Tokens that would be served before an entry of `start` in `entry.band` (aging to come
        not counted)."""
        ahead = sum(self._band_cost[: entry.band])
        same = self._by_tag[entry.band]
        for i in range(bisect_left(same, (start, entry.id))):
            ahead += self._waiting[same[i][1]].cost
        return ahead

    def _remember(self, entry: Entry, start: float) -> None:
        finish = self.finish
        if len(finish) >= PRUNE_TENANTS_AT and entry.tenant not in finish:
            for tenant in [t for t, f in finish.items() if f <= self.vclock]:
                del finish[tenant]
        finish[entry.tenant] = finish_tag(start, entry.cost, entry.weight)

    def _insert(self, entry_id: str, waiting: _Waiting) -> None:
        self._waiting[entry_id] = waiting
        insort(self._by_tag[waiting.band], (waiting.tag, entry_id))
        insort(self._by_entered[waiting.band], (waiting.entered, entry_id))
        self._band_cost[waiting.band] += waiting.cost

    def _remove(self, entry_id: str, waiting: _Waiting) -> None:
        del self._waiting[entry_id]
        for index, key in ((self._by_tag, waiting.tag), (self._by_entered, waiting.entered)):
            entries = index[waiting.band]
            del entries[bisect_left(entries, (key, entry_id))]
        self._band_cost[waiting.band] -= waiting.cost
