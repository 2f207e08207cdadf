"""Where per-key counts live, and the one algorithm both stores run.

Per key:
- `rpm` and `tpm` are token buckets that hold at most the limit and refill at limit/60 per
  second: a key may burst up to its limit, then runs at its rate. A request takes 1 from the
  requests bucket and its reserved tokens from the tokens bucket; settling gives back what it
  reserved and did not use (or takes the excess: a bucket may go below zero, and then refills
  from there). The reset time of a bucket is when it would be full again, as OpenAI reports it.
- `max_parallel` counts the reservations not yet settled; each holds a lease, so that a
  gateway that dies mid-request does not keep its slots for ever.
- `budget_tokens` is a counter per calendar period (UTC day or month): a request is admitted
  while the tokens used and reserved, plus its own reservation, fit the budget.

A request is admitted only when every limit of its key admits it, and then all of them count
it, in one step: `MemoryStore` in this process (one event loop, no awaits inside a step),
`RedisStore` (gateway/keys/redis_store.py) in a Lua script shared by every worker and replica.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gateway.keys.limits import BudgetPeriod, KeyLimits

WINDOW_S = 60.0  # rpm and tpm are per minute
PARALLEL_RETRY_S = 1.0  # no way to know when a slot frees: ask the client to retry soon


class StateStoreError(Exception):
    """The store could not be reached or did not answer in time."""


@dataclass(frozen=True)
class Admission:
    """A store's answer to `admit`: `refused` names the limit that said no (None: admitted,
    and counted). The bucket levels are after the request was counted (or as they stood when
    it was refused), for the `x-ratelimit-*` headers."""

    refused: str | None  # "requests" | "tokens" | "parallel" | "budget"
    retry_after_s: float
    requests: float  # the requests bucket's level (0 when the key has no rpm)
    tokens: float  # the tokens bucket's level (0 when the key has no tpm)
    budget_used: int  # tokens used and reserved in the budget's period


@dataclass(frozen=True)
class KeyUsage:
    """One key's state now, as `switchyard keys usage` prints it."""

    name: str
    requests: float | None  # the requests bucket's level; None: no rpm
    tokens: float | None
    in_flight: int
    budget_used: int | None  # None: no budget
    budget_period: str | None


class StateStore(Protocol):
    """Every call either answers or raises `StateStoreError`, within the store's own timeout."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def admit(
        self, limits: KeyLimits, cost: int, reservation_id: str, lease_s: float, period: BudgetPeriod | None
    ) -> Admission:
        """Check every limit of the key; if all admit `cost` tokens, count them (one step)."""
        ...

    async def settle(self, limits: KeyLimits, reservation_id: str, reserved: int, used: int, period: BudgetPeriod | None) -> None:
        """The reservation is over: give back `reserved - used` tokens, free its parallel slot."""
        ...

    async def usage(self, limits: KeyLimits, period: BudgetPeriod | None) -> KeyUsage: ...

    def describe(self) -> str:
        """Where the counts are kept, for `switchyard keys usage`."""
        ...


def refill(capacity: int, level: float | None, at: float, now: float) -> float:
    """A bucket's level at `now`, having been `level` at `at` (None: never used, so full)."""
    if level is None:
        return float(capacity)
    return min(float(capacity), level + max(0.0, now - at) * capacity / WINDOW_S)


def seconds_to_full(capacity: int, level: float) -> float:
    return max(0.0, (capacity - level) * WINDOW_S / capacity)


def seconds_to(capacity: int, level: float, wanted: float) -> float:
    """How long until the bucket holds `wanted`."""
    return max(0.0, (wanted - level) * WINDOW_S / capacity)


@dataclass
class _KeyState:
    requests: float | None = None
    requests_at: float = 0.0
    tokens: float | None = None
    tokens_at: float = 0.0


class MemoryStore:
    """The counts of one gateway process (one worker): not shared, gone on restart."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._keys: dict[str, _KeyState] = {}
        self._in_flight: dict[str, dict[str, float]] = {}  # key name -> reservation id -> lease end
        self._budgets: dict[tuple[str, str], int] = {}  # (key name, period id) -> tokens

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def describe(self) -> str:
        return "in-process (this gateway process only)"

    async def admit(
        self, limits: KeyLimits, cost: int, reservation_id: str, lease_s: float, period: BudgetPeriod | None
    ) -> Admission:
        now = self.clock()
        state = self._keys.setdefault(limits.name, _KeyState())
        requests = refill(limits.rpm, state.requests, state.requests_at, now) if limits.rpm else 0.0
        tokens = refill(limits.tpm, state.tokens, state.tokens_at, now) if limits.tpm else 0.0
        in_flight = self._leases(limits.name, now)
        budget_key = (limits.name, period.id) if period is not None else None
        used = self._budgets.get(budget_key, 0) if budget_key else 0

        refused, wait = None, 0.0
        if limits.rpm and requests < 1:
            refused, wait = "requests", seconds_to(limits.rpm, requests, 1)
        elif limits.tpm and tokens < cost:
            refused, wait = "tokens", seconds_to(limits.tpm, tokens, cost)
        elif limits.max_parallel and len(in_flight) >= limits.max_parallel:
            refused, wait = "parallel", PARALLEL_RETRY_S
        elif limits.budget_tokens and period is not None and used + cost > limits.budget_tokens:
            refused, wait = "budget", max(0.0, period.ends_at - now)
        if refused is not None:
            return Admission(refused=refused, retry_after_s=wait, requests=requests, tokens=tokens, budget_used=used)

        if limits.rpm:
            requests -= 1
            state.requests, state.requests_at = requests, now
        if limits.tpm:
            tokens -= cost
            state.tokens, state.tokens_at = tokens, now
        if limits.max_parallel:
            in_flight[reservation_id] = now + lease_s
        if budget_key is not None:
            self._forget_old_periods(limits.name, period.id)  # type: ignore[union-attr]
            used = self._budgets[budget_key] = used + cost
        return Admission(refused=None, retry_after_s=0.0, requests=requests, tokens=tokens, budget_used=used)

    async def settle(self, limits: KeyLimits, reservation_id: str, reserved: int, used: int, period: BudgetPeriod | None) -> None:
        now = self.clock()
        state = self._keys.get(limits.name)
        if limits.tpm and state is not None and reserved != used:
            level = refill(limits.tpm, state.tokens, state.tokens_at, now)
            state.tokens, state.tokens_at = min(float(limits.tpm), level + reserved - used), now
        self._in_flight.get(limits.name, {}).pop(reservation_id, None)
        budget_key = (limits.name, period.id) if period is not None else None
        if budget_key in self._budgets:
            self._budgets[budget_key] += used - reserved  # type: ignore[index]

    async def usage(self, limits: KeyLimits, period: BudgetPeriod | None) -> KeyUsage:
        now = self.clock()
        state = self._keys.get(limits.name, _KeyState())
        return KeyUsage(
            name=limits.name,
            requests=refill(limits.rpm, state.requests, state.requests_at, now) if limits.rpm else None,
            tokens=refill(limits.tpm, state.tokens, state.tokens_at, now) if limits.tpm else None,
            in_flight=len(self._leases(limits.name, now)),
            budget_used=self._budgets.get((limits.name, period.id), 0) if period is not None else None,
            budget_period=period.id if period is not None else None,
        )

    def _leases(self, name: str, now: float) -> dict[str, float]:
        leases = self._in_flight.setdefault(name, {})
        for rid in [rid for rid, until in leases.items() if until <= now]:
            del leases[rid]
        return leases

    def _forget_old_periods(self, name: str, current: str) -> None:
        for key in [k for k in self._budgets if k[0] == name and k[1] != current]:
            del self._budgets[key]
