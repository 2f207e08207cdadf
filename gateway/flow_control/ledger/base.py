"""The ledger: a backend's shared accounting of its queue — the requests running (granted, not
released), the requests waiting in fair order, the virtual clock and the tenants' finish tags.
In this process (`MemoryLedger`) or in Redis (`RedisLedger`), shared by every worker.

Each call is one atomic step and answers with `woken`: the grants to entries of this worker
(`owner`) made by that step — also those another worker's step made since this worker last
asked. The queue (`FlowQueue`) wakes their waiters. Every step first serves waiting entries
while the backend (as this worker reads it now) has room, so a grant is never missed because a
step of another kind came first.

Room is two numbers: `top_capacity`, the most that run — `capacity` plus the backend's
`priority_headroom` (None: no headroom, the same as `capacity`) — and `capacity`, the most of
them not sent in the top band (`fair_order`). Requests sent in the top band (band 0) may fill
all of `top_capacity`; the others — the lower bands', and those aged into band 0 — keep their
`capacity` whatever the top band runs, and never take the headroom, so a flood in a lower band,
however long it has waited, never holds the slots an interactive request needs. A grant to a
request sent in the top band made while `capacity` or more run is *into headroom*
(`Grant.into_headroom`).

`release` and `withdraw` are idempotent: whoever is unsure whether an entry was granted may
call them, and a slot is freed once.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, Protocol

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


class Grant(NamedTuple):
    """A slot given to a waiting entry."""

    id: str
    into_headroom: bool  # granted while `capacity` or more ran: in the top band's headroom


class Arrival(msgspec.Struct, frozen=True):
    outcome: Outcome
    ahead: int  # tokens waiting ahead of it (queued, slo); every waiting token (queue_full); 0 (granted)
    woken: tuple[Grant, ...]
    into_headroom: bool = False  # granted (at once) into the top band's headroom


def top_slots(capacity: int, top_capacity: int) -> int:
    """What the top band may fill: never less than every band may."""
    return capacity if top_capacity < capacity else top_capacity


class Ledger(Protocol):
    owner: str  # this worker's part of every entry id

    async def arrive(self, entry: Entry, *, capacity: int, max_queue: int, max_ahead: int | None,
                     top_capacity: int | None = None) -> Arrival:
        """Granted at once when it has room (`fair_order`) and — a lower band's entry — nothing
        waits, or — a top-band entry — whatever waits below it or aged into its band (the
        waiting served first); else
        refused when `max_queue` entries wait, or when more than `max_ahead` tokens (None: no
        bound) would be served before it; else queued in fair order. Only a granted or queued
        entry moves its tenant's finish tag."""
        ...

    async def dispatch(self, capacity: int, top_capacity: int | None = None) -> tuple[Grant, ...]:
        """Serve waiting entries in order while one has room: fewer than `top_capacity` run,
        and — one not sent in the top band — fewer than `capacity` of those; an entry sent in
        the top band goes past a head aged into it that has none."""
        ...

    async def release(self, entry_id: str, capacity: int, top_capacity: int | None = None) -> tuple[Grant, ...]:
        """A granted entry is over: its slot goes to the next in order."""
        ...

    async def withdraw(self, entry_id: str, capacity: int, top_capacity: int | None = None) -> tuple[Grant, ...]:
        """An entry's request is gone: out of the queue if it waits, released if it was granted."""
        ...

    async def waiting(self) -> int:
        """Entries waiting now (every worker's)."""
        ...

    async def close(self) -> None: ...

    def describe(self) -> str: ...
