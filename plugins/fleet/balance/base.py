"""The one small interface every placement policy implements, whether it picks a replica
inside a backend or a target of a route.

A policy sees candidates (already filtered: routable, not tried yet, never empty) through
`Candidate` — a name, the gateway's own requests in flight there, and the load routing should
believe (`load()`: the engine's reported running + waiting, corrected by what was sent and
finished since the scrape, or the in-flight count when the scrape is stale) — and returns one
with the reason it chose it (counted in metrics). `kv_cache_usage()` (0..1) breaks load ties;
`cache_tokens()` is the engine's KV cache size when it told it (how much a prefix index may
believe it holds). `failed` says an attempt on a candidate failed
before its first byte; `forget` that a candidate is gone for good.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, NamedTuple, Protocol, TypeVar

from plugins.contract.protocol import RequestSpec


class Candidate(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def weight(self) -> float: ...

    def load(self) -> float: ...

    def kv_cache_usage(self) -> float: ...

    def cache_tokens(self) -> int | None: ...


C = TypeVar("C", bound=Candidate)


class Choice(NamedTuple, Generic[C]):
    candidate: C
    reason: str  # a bounded label: round_robin, least_busy, least_load, prefix_hit, prefix_miss, prefix_overloaded,
    # session_hit, session_new, session_moved


class Balancer(Protocol):
    def choose(self, spec: RequestSpec, candidates: Sequence[C]) -> Choice[C]: ...

    def failed(self, spec: RequestSpec, name: str) -> None: ...

    def forget(self, name: str) -> None: ...

    def cached_blocks(self, name: str) -> int: ...


class Stateless:
    """The do-nothing half of `Balancer` for policies that keep no per-candidate state."""

    def failed(self, spec: RequestSpec, name: str) -> None:
        pass

    def forget(self, name: str) -> None:
        pass

    def cached_blocks(self, name: str) -> int:
        return 0


def rotated(candidates: Sequence[C], turn: int) -> list[C]:
    """`candidates` starting at position `turn` (mod their number): ties go round the list."""
    k = turn % len(candidates)
    return [*candidates[k:], *candidates[:k]]
