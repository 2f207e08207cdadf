"""The ledger: a backend's shared accounting of its queue — the requests running (granted, not
released), the requests waiting in fair order, the virtual clock and the tenants' finish tags.
In this process (`MemoryLedger`) or in Redis (`RedisLedger`), shared by every worker.

Each call is one atomic step and answers with `woken`: the entries of this worker (`owner`)
granted a slot by that step — also those another worker's step granted since this worker last
asked. The queue (`FlowQueue`) wakes their waiters. Every step first serves waiting entries
while `capacity` (the backend's, as this worker reads it now) has room, so a grant is never
missed because a step of another kind came first.

`release` and `withdraw` are idempotent: whoever is unsure whether an entry was granted may
call them, and a slot is freed once.
"""

from __future__ import annotations

from typing import Literal, Protocol

import msgspec

Outcome = Literal["granted", "queued", "queue_full", "slo"]


class LedgerError(Exception):
    """The shared ledger could not be reached or did not answer in time."""


class Entry(msgspec.Struct, frozen=True):
    """One request as the ledger knows it."""

    id: str  # `fair_order.entry_id`: unique among every worker sharing the ledger
    tenant: str
    band: int
    cost: int  # tokens: the prompt's estimate plus the output counted for it
    weight: float


class Arrival(msgspec.Struct, frozen=True):
    outcome: Outcome
    ahead: int  # tokens waiting ahead of it (queued, slo); every waiting token (queue_full); 0 (granted)
    woken: tuple[str, ...]


class Ledger(Protocol):
    owner: str  # this worker's part of every entry id

    async def arrive(self, entry: Entry, *, capacity: int, max_queue: int, max_ahead: int | None) -> Arrival:
        """Granted at once when nothing waits and fewer than `capacity` run; else refused when
        `max_queue` entries wait, or when more than `max_ahead` tokens (None: no bound) would be
        served before it; else queued in fair order. Only a granted or queued entry moves its
        tenant's finish tag."""
        ...

    async def dispatch(self, capacity: int) -> tuple[str, ...]:
        """Serve waiting entries while fewer than `capacity` run."""
        ...

    async def release(self, entry_id: str, capacity: int) -> tuple[str, ...]:
        """A granted entry is over: its slot goes to the next in order."""
        ...

    async def withdraw(self, entry_id: str, capacity: int) -> tuple[str, ...]:
        """An entry's request is gone: out of the queue if it waits, released if it was granted."""
        ...

    async def waiting(self) -> int:
        """Entries waiting now (every worker's)."""
        ...

    async def close(self) -> None: ...

    def describe(self) -> str: ...
