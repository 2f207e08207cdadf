"""Per-key limits and token budgets: `[[server.keys]]` `rpm`, `tpm`, `max_parallel`,
`budget_tokens` per `budget_period`, counted in this process or in Redis (`[server] state`).

- `limits.py`: a key's limits, a request's cost (reserved up front), the budget's period.
- `store.py`: the algorithm (token buckets, leases, period counters) and the in-process store.
- `redis_store.py`: the same algorithm as Lua scripts in Redis, shared by workers and replicas.
- `limiter.py`: `KeyLimiter.admit` → `Reservation` (`settle` / `release`), the 429s and the
  `x-ratelimit-*` headers, and what a store failure means (`on_state_error`).
- `usage.py`: `switchyard keys usage` and the gateway's `/switchyard/keys/usage`.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from gateway.config import Config
from gateway.errors import BudgetExhausted, KeyLimitExceeded, StateUnavailable
from gateway.keys.limiter import NO_RESERVATION, KeyLimiter, Reservation
from gateway.keys.limits import KeyLimits, TokenCost
from gateway.keys.store import MemoryStore, StateStore

__all__ = [
    "NO_RESERVATION", "BudgetExhausted", "KeyLimitExceeded", "KeyLimiter", "KeyLimits", "Reservation", "StateUnavailable",
    "LEASE_DEFAULT_S", "TokenCost", "build_key_limiter", "build_store", "longest_deadline",
]

LEASE_DEFAULT_S = 600.0  # how long a parallel slot is held when requests have no deadline
LEASE_MARGIN_S = 10.0


def build_store(config: Config) -> StateStore:
    server = config.server
    if server.state is None:
        return MemoryStore()
    from gateway.keys.redis_store import RedisStore  # the redis client is imported only when used

    return RedisStore(server.state, timeout_s=server.state_timeout_s)


def build_key_limiter(config: Config, registry: CollectorRegistry, max_model_len_of: Callable[[str], int | None]) -> KeyLimiter:
    server = config.server
    return KeyLimiter(
        build_store(config),
        on_state_error=server.on_state_error,
        lease_s=longest_deadline(config) + LEASE_MARGIN_S,
        max_model_len_of=max_model_len_of,
        registry=registry,
    )


def longest_deadline(config: Config) -> float:
    """The longest a request may run (server or route `request_timeout_s`): how long a parallel
    slot is held by a gateway that died before settling it."""
    server = config.server
    deadlines = [server.request_timeout_s] + [route.request_timeout_s or server.request_timeout_s for route in config.routes]
    return LEASE_DEFAULT_S if None in deadlines else max(d for d in deadlines if d is not None)
