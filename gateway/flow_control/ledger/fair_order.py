"""The order waiting requests are served in: start-time fair queueing (SFQ) on token cost,
inside priority bands that age. Both ledgers (`memory_ledger`, `redis_ledger`) run exactly this,
in the same floating-point steps, so they give the same order.

Per backend there is one virtual clock `V`, and per tenant the finish tag `F` of its last
admitted request. A request of cost `c` (tokens) from a tenant of weight `w` gets

    start tag  S = max(V, F_tenant)        finish tag  F_tenant = S + c / w

and when a request is dispatched, `V = max(V, S)`. Waiting requests are served lowest band
first, and inside a band by `(S, id)`. So a tenant that sends ten times the traffic advances its
own `F` ten times as fast and waits behind everyone whose tags are lower; a tenant that was
quiet starts at `V` (no credit for idleness, no penalty either); with weights 3:1 two backlogged
tenants are served 3:1 in tokens.

Aging: a request that has waited `aging_s` in its band moves to the band above (keeping its
tag), and so on each `aging_s`, up to band 0: a low band waits at most `aging_s` per band it
is below the top, whatever arrives above it.

Ids are fixed-width, `<12 hex digits>.<owner>`, so ties in `S` break the same way in Python
(tuple order) and in Redis (members of equal score sort by bytes).
"""

from __future__ import annotations


def start_tag(vclock: float, tenant_finish: float | None) -> float:
    return vclock if tenant_finish is None or tenant_finish < vclock else tenant_finish


def finish_tag(start: float, cost: int, weight: float) -> float:
    return start + cost / weight


def entry_id(seq: int, owner: str) -> str:
    return f"{seq:012x}.{owner}"


def owner_of(entry_id: str) -> str:
    return entry_id.partition(".")[2]
