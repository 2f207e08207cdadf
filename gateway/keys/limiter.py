"""The per-key limiter every endpoint calls: `admit` before the work, `settle` once after it.

    reservation = await limiter.admit(client_key, spec)   # 429 (KeyLimitExceeded) when over a limit
    ...serve, putting reservation.headers on the response...
    reservation.settle(usage, completion_seen=n)          # once, at the end: done, failed or cancelled
    reservation.release()                                 # = settle on nothing used

`admit` reserves the request's estimated cost (gateway/keys/limits.py) in the state store;
`settle` hands the store the real usage in a task of its own, so the response never waits for
it. Settling twice is harmless (the second does nothing). A key without limits gets
`NO_RESERVATION` and costs nothing: no store call, no headers.

When the store cannot be reached, `on_state_error` decides: "allow" admits the request
uncounted (logged once per outage), "deny" answers 503 `state_unavailable`. After a failure the
store is not asked again for `STATE_RETRY_S`, so an outage costs one timeout per second, not one
per request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import secrets
import time
from collections.abc import Callable
from typing import Literal

from prometheus_client import CollectorRegistry, Counter

from gateway.errors import BudgetExhausted, KeyLimitExceeded, StateUnavailable
from gateway.keys.limits import NO_COST, BudgetPeriod, KeyLimits, TokenCost, request_cost
from gateway.keys.store import Admission, StateStore, StateStoreError, seconds_to_full
from plugins.contract.protocol import RequestSpec, Usage

log = logging.getLogger("switchyard.keys")

STATE_RETRY_S = 1.0
SETTLE_DRAIN_S = 5.0  # on close, settlements still running get this long
MESSAGES = {
    "requests": "requests per minute (rpm)",
    "tokens": "tokens per minute (tpm)",
    "parallel": "requests in flight (max_parallel)",
}




class Reservation:
    """What one admitted request holds in the store until it is settled."""

    __slots__ = ("limiter", "limits", "id", "cost", "period", "headers", "settled")

    def __init__(self, limiter: KeyLimiter | None, limits: KeyLimits | None, id: str = "", cost: TokenCost = NO_COST,
                 period: BudgetPeriod | None = None, headers: dict[str, str] | None = None) -> None:
        self.limiter = limiter
        self.limits = limits
        self.id = id
        self.cost = cost
        self.period = period
        self.headers = headers or {}
        self.settled = limits is None

    def settle(self, usage: Usage | None, completion_seen: int = 0) -> None:
        """The request is over. `usage`: what the backend reported; None when it reported
        nothing (failed or cancelled): then the prompt's estimate plus the `completion_seen`
        tokens that reached the gateway — or nothing at all when none did."""
        if self.settled:
            return
        self.settled = True
        if usage is not None:
            used = usage.prompt_tokens + usage.completion_tokens
        else:
            used = self.cost.prompt + completion_seen if completion_seen else 0
        limits = self.limits
        assert limits is not None
        if limits.max_parallel or (limits.counts_tokens and used != self.cost.total):  # else nothing to give back
            self.limiter._settle_later(self, used)  # type: ignore[union-attr]

    def release(self) -> None:
        """Nothing was used (the request failed before any backend work)."""
        self.settle(None)


NO_RESERVATION = Reservation(None, None)


class KeyLimiter:
    def __init__(
        self,
        store: StateStore,
        *,
        registry: CollectorRegistry,  # the app's metrics registry
        on_state_error: Literal["allow", "deny"] = "allow",
        lease_s: float = 600.0,
        max_model_len_of: Callable[[str], int | None] = lambda model: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.on_state_error = on_state_error
        self.lease_s = lease_s
        self.max_model_len_of = max_model_len_of
        self.clock = clock
        self._down_until = 0.0
        self._id_prefix = secrets.token_hex(4) + "-"  # unique among the gateways sharing a store
        self._ids = itertools.count()
        self._pending: set[asyncio.Task[None]] = set()
        self.refusals = Counter("switchyard_key_limit_refusals", "Requests refused by a client key's limit, by key and limit.",
                                ("key", "limit"), registry=registry)
        self.state_errors = Counter("switchyard_key_state_errors", "Calls to the limits' state store that failed, by step.",
                                    ("step",), registry=registry)

    async def start(self) -> None:
        await self.store.start()

    async def close(self) -> None:
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=SETTLE_DRAIN_S)
        await self.store.close()

    # -- admission ---------------------------------------------------------------------------

    async def admit(self, limits: KeyLimits | None, spec: RequestSpec | None = None, *, cost: TokenCost | None = None) -> Reservation:
        """Reserve one request of `spec` (or of `cost`) for the key; `NO_RESERVATION` for a key
        without limits. Raises `KeyLimitExceeded` (429) or `StateUnavailable` (503)."""
        if limits is None:
            return NO_RESERVATION
        if cost is None:
            cost = request_cost(spec, self.max_model_len_of(spec.model)) if limits.counts_tokens and spec is not None else NO_COST
        self._refuse_impossible(limits, cost.total)
        now = self.clock()
        period = BudgetPeriod.at(limits.budget_period, now) if limits.budget_tokens else None
        if now < self._down_until:
            return self._state_error("admit", None)
        reservation_id = f"{self._id_prefix}{next(self._ids)}"
        try:  # a remote store bounds each call by its own timeout
            admission = await self.store.admit(limits, cost.total, reservation_id, self.lease_s, period)
        except StateStoreError as exc:
            return self._state_error("admit", exc)
        headers = rate_limit_headers(limits, admission)
        if admission.refused is not None:
            self.refusals.labels(limits.name, admission.refused).inc()
            raise _refusal(limits, admission, cost.total, period, headers)
        return Reservation(self, limits, reservation_id, cost, period, headers)

    def _refuse_impossible(self, limits: KeyLimits, total: int) -> None:
        """A request that could never fit: no point in waiting for it."""
        for limit, name in ((limits.tpm, "tpm"), (limits.budget_tokens, "budget_tokens")):
            if limit is not None and total > limit:
                self.refusals.labels(limits.name, "too_large").inc()
                raise KeyLimitExceeded(
                    f"This request reserves {total} tokens (its prompt's estimate plus max_tokens for every choice), more than "
                    f"this API key's `{name}` of {limit}; lower `max_tokens`.",
                    retry_after_s=None, headers={}, code="request_too_large",
                )

    def _state_error(self, step: str, exc: BaseException | None) -> Reservation:
        if exc is not None:
            self.state_errors.labels(step).inc()
            if self._down_until <= self.clock():
                log.warning("per-key limits: the state store (%s) failed: %s; following on_state_error=%s for %g s",
                            self.store.describe(), exc, self.on_state_error, STATE_RETRY_S)
            self._down_until = self.clock() + STATE_RETRY_S
        if self.on_state_error == "deny":
            raise StateUnavailable(
                "Per-key rate limits cannot be checked right now (their state store is unreachable); retry shortly.",
                code="state_unavailable",
            )
        return NO_RESERVATION

    # -- settlement --------------------------------------------------------------------------

    def _settle_later(self, reservation: Reservation, used: int) -> None:
        task = asyncio.get_running_loop().create_task(self._settle(reservation, used))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _settle(self, reservation: Reservation, used: int) -> None:
        limits = reservation.limits
        assert limits is not None
        try:
            await self.store.settle(limits, reservation.id, reservation.cost.total, used, reservation.period)
        except StateStoreError as exc:
            self.state_errors.labels("settle").inc()
            log.warning("per-key limits: settling a request of key %s failed (%s); its reservation expires on its own",
                        limits.name, exc)


def _refusal(limits: KeyLimits, admission: Admission, cost: int, period: BudgetPeriod | None, headers: dict[str, str]) -> KeyLimitExceeded:
    wait = math.ceil(admission.retry_after_s) if admission.retry_after_s > 0 else 1
    if admission.refused == "budget":
        assert period is not None and limits.budget_tokens is not None
        return BudgetExhausted(
            f"This API key has used {admission.budget_used} of its {limits.budget_tokens} tokens for {period.id} "
            f"and this request reserves {cost} more; the budget renews in {go_duration(admission.retry_after_s)}.",
            retry_after_s=wait, headers=headers, code="insufficient_quota",
        )
    limit = {"requests": limits.rpm, "tokens": limits.tpm, "parallel": limits.max_parallel}[admission.refused]  # type: ignore[index]
    what = MESSAGES[admission.refused]  # type: ignore[index]
    return KeyLimitExceeded(
        f"Rate limit reached for this API key on {what}: limit {limit}. Please try again in {go_duration(admission.retry_after_s)}.",
        retry_after_s=wait, headers=headers,
    )


def rate_limit_headers(limits: KeyLimits, admission: Admission) -> dict[str, str]:
    """OpenAI's `x-ratelimit-*` headers for the key's rpm and tpm (the ones it has)."""
    headers: dict[str, str] = {}
    if limits.rpm:
        headers["x-ratelimit-limit-requests"] = str(limits.rpm)
        headers["x-ratelimit-remaining-requests"] = str(max(0, math.floor(admission.requests)))
        headers["x-ratelimit-reset-requests"] = go_duration(seconds_to_full(limits.rpm, admission.requests))
    if limits.tpm:
        headers["x-ratelimit-limit-tokens"] = str(limits.tpm)
        headers["x-ratelimit-remaining-tokens"] = str(max(0, math.floor(admission.tokens)))
        headers["x-ratelimit-reset-tokens"] = go_duration(seconds_to_full(limits.tpm, admission.tokens))
    return headers


def go_duration(seconds: float) -> str:
    """A duration as OpenAI writes it in `x-ratelimit-reset-*` (Go's format): "0s", "12ms",
    "1s", "8.64s", "6m0s", "1h2m3s"."""
    seconds = round(max(0.0, seconds), 3)
    if seconds == 0:
        return "0s"
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if hours or minutes:
        text = f"{int(minutes)}m" + text
    if hours:
        text = f"{int(hours)}h" + text
    return text
