"""The ledger of one gateway process: the algorithm of `fair_order`, on plain lists.

Each band keeps its entries twice, sorted: by `(tag, id)` to serve the head, and by
`(entered, id)` — when the entry came into the band — to age the oldest; the entries sent in the
top band, which alone may take its headroom, are also kept by `(tag, id)` apart, so the first of
them is found when an aged-in head waits for the lower bands' room. Queues are bounded
(`max_queue`), so a sorted list's insertion, a C-speed move, beats a tree here. Nothing awaits
inside a step: each is atomic on the event loop, and a grant with room and nothing waiting is a
few dictionary operations. The steps are plain methods (`*_now`), which `FlowQueue` calls
inline — no coroutine, no task — beside the `Ledger` protocol's async ones; they take the room
(capacity, top capacity) as a callable, read only when the step needs it (a release with nobody
waiting does not).
"""

from __future__ import annotations

import time
from bisect import bisect_left, insort
from collections.abc import Callable
from dataclasses import dataclass

from gateway.flow_control.ledger.base import Arrival, Entry, Grant, top_slots
from gateway.flow_control.ledger.fair_order import finish_tag, start_tag

Room = Callable[[], tuple[int, int]]  # (capacity, top_capacity): read when a step needs it

PRUNE_TENANTS_AT = 4096  # past this many remembered tenants, forget those whose tags V has passed


@dataclass(slots=True)
class _Waiting:
    tag: float
    entered: float  # when it came into its present band
    band: int  # its band now, after aging
    cost: int
    sent_top: bool  # sent in the top band (not aged into it): it may take the headroom


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
        self.running_top: set[str] = set()  # those of `running` sent in the top band
        self._waiting: dict[str, _Waiting] = {}
        self._by_tag: list[list[tuple[float, str]]] = [[] for _ in range(num_bands)]
        self._by_entered: list[list[tuple[float, str]]] = [[] for _ in range(num_bands)]
        self._sent_top: list[tuple[float, str]] = []  # (tag, id) of those waiting that were sent in the top band
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

    async def arrive(self, entry: Entry, *, capacity: int, max_queue: int, max_ahead: int | None,
                     top_capacity: int | None = None) -> Arrival:
        return self.arrive_now(entry, _room(capacity, top_capacity), max_queue, max_ahead)

    async def dispatch(self, capacity: int, top_capacity: int | None = None) -> tuple[Grant, ...]:
        return self.dispatch_now(_room(capacity, top_capacity))

    async def release(self, entry_id: str, capacity: int, top_capacity: int | None = None) -> tuple[Grant, ...]:
        return self.release_now(entry_id, _room(capacity, top_capacity))

    async def withdraw(self, entry_id: str, capacity: int, top_capacity: int | None = None) -> tuple[Grant, ...]:
        return self.withdraw_now(entry_id, _room(capacity, top_capacity))

    def arrive_now(self, entry: Entry, room: Room, max_queue: int, max_ahead: int | None) -> Arrival:
        woken = self.dispatch_now(room) if self._waiting else ()
        start = start_tag(self.vclock, self.finish.get(entry.tenant))
        # after the dispatch none sent in the top band waits while there is room for it (one aged
        # into it may, for the lower bands' room): only a lower band's arrival waits its turn
        # behind those waiting
        sent_top = entry.band == 0
        if sent_top or not self._waiting:
            capacity, top = room()
            if self._fits(sent_top, capacity, top_slots(capacity, top)):
                return self._grant_at_once(entry, start, woken, sent_top and len(self.running) >= capacity)
        if len(self._waiting) >= max_queue:
            return Arrival("queue_full", sum(self._band_cost), woken)
        ahead = self._ahead(entry, start)
        if max_ahead is not None and ahead > max_ahead:
            return Arrival("slo", ahead, woken)
        self._remember(entry, start)
        self._insert(entry.id, _Waiting(start, self.clock(), entry.band, entry.cost, sent_top))
        return Arrival("queued", ahead, woken)

    def release_now(self, entry_id: str, room: Room) -> tuple[Grant, ...]:
        self.running.discard(entry_id)
        self.running_top.discard(entry_id)
        return self.dispatch_now(room)

    def withdraw_now(self, entry_id: str, room: Room) -> tuple[Grant, ...]:
        waiting = self._waiting.get(entry_id)
        if waiting is not None:
            self._remove(entry_id, waiting)
        self.running.discard(entry_id)
        self.running_top.discard(entry_id)
        return self.dispatch_now(room)

    def dispatch_now(self, room: Room) -> tuple[Grant, ...]:
        if not self._waiting:
            return ()
        self._age()
        capacity, top = room()
        top = top_slots(capacity, top)
        woken: list[Grant] = []
        while self._waiting:
            band = next(b for b, entries in enumerate(self._by_tag) if entries)
            tag, entry_id = self._by_tag[band][0]
            sent_top = self._waiting[entry_id].sent_top
            if not self._fits(sent_top, capacity, top):
                # no entry like the head can go; only one sent in the top band may, into the
                # headroom, past a head that aged into it and waits for the lower bands' room
                if sent_top or not self._sent_top or not self._fits(True, capacity, top):
                    break
                (tag, entry_id), sent_top = self._sent_top[0], True
            self._remove(entry_id, self._waiting[entry_id])
            if tag > self.vclock:
                self.vclock = tag
            woken.append(Grant(entry_id, sent_top and len(self.running) >= capacity))
            self._run(entry_id, sent_top)
        return tuple(woken)

    # -- inside a step ----------------------------------------------------------------------------

    def _fits(self, sent_top: bool, capacity: int, top: int) -> bool:
        """`fair_order`'s room: fewer than `top` run, and for an entry not sent in the top band
        (a lower band's, or one aged into the top band) fewer than `capacity` of those."""
        running = len(self.running)
        return running < top and (sent_top or running - len(self.running_top) < capacity)

    def _run(self, entry_id: str, sent_top: bool) -> None:
        self.running.add(entry_id)
        if sent_top:
            self.running_top.add(entry_id)

    def _grant_at_once(self, entry: Entry, start: float, woken: tuple[Grant, ...], into_headroom: bool) -> Arrival:
        self._remember(entry, start)
        self.vclock = start
        self._run(entry.id, entry.band == 0)
        return Arrival("granted", 0, woken, into_headroom)

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
        if waiting.sent_top:
            insort(self._sent_top, (waiting.tag, entry_id))
        self._band_cost[waiting.band] += waiting.cost

    def _remove(self, entry_id: str, waiting: _Waiting) -> None:
        del self._waiting[entry_id]
        for index, key in ((self._by_tag, waiting.tag), (self._by_entered, waiting.entered)):
            entries = index[waiting.band]
            del entries[bisect_left(entries, (key, entry_id))]
        if waiting.sent_top:
            del self._sent_top[bisect_left(self._sent_top, (waiting.tag, entry_id))]
        self._band_cost[waiting.band] -= waiting.cost


def _room(capacity: int, top_capacity: int | None) -> Room:
    room = (capacity, capacity if top_capacity is None else top_capacity)
    return lambda: room
