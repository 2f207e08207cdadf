"""A's share of the slots while others wait, read from the gateway's request log (issue 34's
target "A never above its weighted share while B or C waits"), for `bench/flow_control.py`.

What the fair order decides is who gets each slot as it frees: a *grant*. From the request log
(one line per request; request ids `<tenant>-<nonce>`):

- a request *waited in the gateway queue* from its start (`ts`) to its grant (`ts` +
  `queued_ms`), or, refused after `queue_timeout_s`, to its refusal (`ts` + `e2e`); a request
  granted at once never waited;
- every request that got a slot was *granted* at `ts` + `queued_ms` (0 when it went straight
  through);
- a waiting request's band at time t is its own band (its key's `priority`) less one per
  `aging_s` it has waited by then, down to 0 — as the ledger ages it.

A grant *counts* when, at its instant, some request of another tenant than A was waiting in A's
band or above (a band number at most A's own) — its own grant included: the slot it got is one
the order gave it while it waited. A's share is A's grants over the counted grants. A's
weighted share at each counted grant is A's weight over the weights of the tenants in
contention then in A's band or above (A, when it waits or is the one granted, and each other
tenant waiting there); its mean over the counted grants is what A is owed. Every request in the
benchmark costs the same tokens, so grants stand for tokens.

`literal=True` counts every band instead: a tenant in a *lower* band (C, batch) waits while A's
band is served first until aging lifts it — bands before fairness, by design — so the target as
worded cannot hold for it; the in-band figure is the one fair queueing answers for.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

QUEUE_TIMEOUT_ERROR = "queue_timeout"


@dataclass(frozen=True)
class Request:
    tenant: str
    start: float
    waited_until: float | None  # its grant or its refusal after waiting; None: never waited
    granted_at: float | None  # None: never granted


@dataclass(frozen=True)
class Share:
    counted_grants: int
    a_grants: int
    owed: float | None  # A's mean weighted share over the counted grants

    @property
    def share(self) -> float | None:
        return None if not self.counted_grants else self.a_grants / self.counted_grants

    def as_dict(self) -> dict[str, float | int | None]:
        return {"counted_grants": self.counted_grants, "a_grants": self.a_grants, "a_share": self.share, "a_owed": self.owed}


def read_log(path: Path, settle_s: float = 10.0) -> list[dict]:
    """The log's lines, once every request in it has its line written (the log is flushed in batches)."""
    deadline = time.monotonic() + settle_s
    lines: list[dict] = []
    while time.monotonic() < deadline:
        lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        if lines and all(line.get("outcome") for line in lines):
            break
        time.sleep(0.5)
    return lines


def requests_of(lines: Sequence[dict]) -> list[Request]:
    made = []
    for line in lines:
        tenant, start = line["request_id"].split("-", 1)[0], line["ts"]
        queued_s = (line.get("queued_ms") or 0) / 1000
        granted = line.get("outcome") == "ok" or "queued_ms" in line
        if granted:
            made.append(Request(tenant, start, start + queued_s if queued_s > 0 else None, start + queued_s))
        elif line.get("error") == QUEUE_TIMEOUT_ERROR:
            made.append(Request(tenant, start, start + line["e2e"], None))
    return made


def band_at(request: Request, t: float, bands: Mapping[str, int], aging_s: float) -> int:
    own = bands[request.tenant]
    return own if aging_s <= 0 else max(0, own - math.floor((t - request.start) / aging_s))


def a_share(requests: Sequence[Request], *, bands: Mapping[str, int], weights: Mapping[str, float], aging_s: float,
            literal: bool = False) -> Share:
    """A's share of the grants made while another tenant waited in A's band or above (every band
    with `literal`), and what its weight owed it then (see the module)."""
    top = max(bands.values()) if literal else bands["A"]
    waits = [r for r in requests if r.waited_until is not None]
    counted = a_grants = 0
    owed = 0.0
    for grant in sorted((r for r in requests if r.granted_at is not None), key=lambda r: r.granted_at):  # type: ignore[arg-type,return-value]
        t = grant.granted_at
        waiting = {r.tenant for r in waits if r.start < t <= r.waited_until and band_at(r, t, bands, aging_s) <= top}  # type: ignore[operator]
        if not waiting - {"A"}:
            continue
        contending = waiting | {grant.tenant}
        counted += 1
        a_grants += grant.tenant == "A"
        owed += weights["A"] / sum(weights[t] for t in contending) if "A" in contending else 0.0
    return Share(counted, a_grants, owed / counted if counted else None)
