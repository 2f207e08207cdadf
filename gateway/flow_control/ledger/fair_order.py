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
is below the top, whatever arrives above it — for a slot of the lower bands' `capacity`, below.

Room, with the top band's headroom: the backend runs at most `top_capacity` requests
(`capacity` plus its `priority_headroom`; no headroom: `capacity`), and of them at most
`capacity` that were not *sent* in the top band. Which room an entry may take is decided by the
band it was sent in, never by the band aging has lifted it to:

- an entry sent in band 0 goes while fewer than `top_capacity` run — a top-band arrival at
  once, whatever waits below it or has aged in beside it;
- any other entry — a lower band's, or one aged into band 0 — goes while fewer than `capacity`
  of those not sent in band 0 run (and fewer than `top_capacity` in all).

So the lower bands keep their `capacity` whatever the top band runs, and the headroom is always
free of them, however long they have waited: aging is against starvation among the ordinary
slots, not a way into the headroom (else a flood's old backlog, aged into band 0, would take the
very slots kept for interactive requests). An entry aged into band 0 is still ordered as band 0
among the waiting — by `(S, id)` with those sent there — and goes first when both may; when the
lower bands' room is full, the first entry sent in band 0 goes past it into the headroom. A
grant to an entry sent in band 0 made while `capacity` or more run is *into headroom*.

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
