"""One replica of a proxy backend: its own connection pool, request counts and engine load
signals. (Its circuit breaker lives in the fleet's `HealthMonitor`, under the replica's URL.)"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from plugins.fleet.load_signals import LoadSnapshot
from plugins.transport import http1

MAX_SCRAPE_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    """What the gateway exports per replica (`switchyard_replica_*` metrics)."""

    backend: str
    replica: str
    draining: bool
    in_flight: int
    circuit: int  # 0 closed, 1 half-open, 2 open
    healthy: bool | None  # the last probe's answer; None: not probed yet
    attempts: dict[str, int]  # by outcome: ok, cancelled, or the error kind
    routed: dict[str, int]  # by the placement policy's reason
    load: float  # what routing believes: engine running + waiting (corrected), or in-flight when stale
    stale: bool  # no engine scrape within 3 intervals (or none at all)
    signal_age_s: float | None
    running: float | None
    waiting: float | None
    kv_cache_usage: float | None
    prefix_queried_tokens: float | None
    prefix_hit_tokens: float | None
    cached_blocks: int  # blocks the prefix index believes this replica holds


@dataclass(eq=False)
class Replica:
    """A replica's own state. `load()` is the engine's last reported running + waiting,
    plus the requests this gateway sent since that scrape, less those that finished since —
    or, once the scrape is older than `stale_after_s`, this gateway's in-flight count."""

    url: str
    pool: http1.Pool
    health_path: str = "/health"
    stale_after_s: float = 3.0
    weight: float = 1.0
    in_flight: int = 0
    draining: bool = False
    snapshot: LoadSnapshot | None = None
    sent_since_scrape: int = 0
    done_since_scrape: int = 0
    attempts: dict[str, int] = field(default_factory=dict)
    routed: dict[str, int] = field(default_factory=dict)
    load_source: int = 0  # which of the fleet's load sources answered last
    scrape_task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.url

    def fresh_snapshot(self) -> LoadSnapshot | None:
        snap = self.snapshot
        if snap is None or time.monotonic() - snap.at > self.stale_after_s:
            return None
        return snap

    def load(self) -> float:
        snap = self.fresh_snapshot()
        if snap is None:
            return float(self.in_flight)
        return max(0.0, snap.running + snap.waiting + self.sent_since_scrape - self.done_since_scrape)

    def kv_cache_usage(self) -> float:
        snap = self.fresh_snapshot()
        return 0.0 if snap is None or snap.kv_cache_usage is None else snap.kv_cache_usage

    def cache_tokens(self) -> int | None:
        return None if self.snapshot is None else self.snapshot.cache_tokens

    def observe(self, snapshot: LoadSnapshot) -> None:
        self.snapshot = snapshot
        self.sent_since_scrape = self.done_since_scrape = 0

    def begin(self, reason: str) -> None:
        self.in_flight += 1
        self.sent_since_scrape += 1
        self.routed[reason] = self.routed.get(reason, 0) + 1

    def end(self, outcome: str) -> None:
        self.in_flight -= 1
        self.done_since_scrape += 1
        self.attempts[outcome] = self.attempts.get(outcome, 0) + 1

    async def health(self) -> bool:
        """GET the health path: 200 is healthy. (The fleet's monitor bounds the wait.)"""
        try:
            status, _ = await self.get(self.health_path, 60.0)
        except (http1.HTTPError, TimeoutError, OSError):
            return False
        return status == 200

    async def get(self, path: str, timeout_s: float) -> tuple[int, bytes]:
        """GET `path` with the whole exchange bounded by `timeout_s`; (status, body)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        response = await self.pool.request("GET", path, deadline=deadline)
        try:
            body = await response.read(MAX_SCRAPE_BYTES, deadline)
        finally:
            await response.aclose()
        return response.status, body
