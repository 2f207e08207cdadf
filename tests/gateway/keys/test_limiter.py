"""The limiter on top of a store: reservations and their settlement, the 429s and their
headers in OpenAI's formats, and what an unreachable store means under `on_state_error`."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from prometheus_client import CollectorRegistry

from gateway.keys import NO_RESERVATION, BudgetExhausted, KeyLimiter, KeyLimitExceeded, KeyLimits, StateUnavailable, TokenCost
from gateway.keys.limiter import go_duration
from gateway.keys.limits import BudgetPeriod, estimate_prompt_tokens, request_cost
from gateway.keys.redis_store import RedisStore
from gateway.keys.store import MemoryStore
from plugins.contract.protocol import RequestSpec, Sampling, Usage
from tests.gateway.keys.conftest import FakeClock
from tests.support.server import free_port

pytestmark = pytest.mark.anyio


def limiter(clock: FakeClock, store=None, **kwargs) -> KeyLimiter:  # noqa: ANN001
    return KeyLimiter(store or MemoryStore(clock=clock), registry=CollectorRegistry(), clock=clock, **kwargs)


async def settled(limiter: KeyLimiter) -> None:
    await asyncio.gather(*limiter._pending)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.0004, "0s"), (0.012, "12ms"), (0.9994, "999ms"), (1, "1s"), (8.64, "8.64s"), (59.9996, "1m0s"),
     (360, "6m0s"), (3723.5, "1h2m3.5s")],
)
def test_durations_are_written_as_openai_writes_them(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


async def test_a_key_without_limits_costs_nothing(clock: FakeClock) -> None:
    assert await limiter(clock).admit(None, cost=TokenCost(10, 10)) is NO_RESERVATION
    NO_RESERVATION.settle(Usage(prompt_tokens=1, completion_tokens=1))  # a no-op, whatever it is told


async def test_headers_on_admission_and_on_refusal(clock: FakeClock) -> None:
    lim = limiter(clock)
    key = KeyLimits(name="k", rpm=2, tpm=600)
    first = await lim.admit(key, cost=TokenCost(20, 100))
    assert first.headers == {
        "x-ratelimit-limit-requests": "2",
        "x-ratelimit-remaining-requests": "1",
        "x-ratelimit-reset-requests": "30s",
        "x-ratelimit-limit-tokens": "600",
        "x-ratelimit-remaining-tokens": "480",
        "x-ratelimit-reset-tokens": "12s",
    }
    await lim.admit(key, cost=TokenCost(0, 0))
    with pytest.raises(KeyLimitExceeded) as refused:
        await lim.admit(key, cost=TokenCost(0, 0))
    assert refused.value.retry_after_s == 30
    assert refused.value.code == "rate_limit_exceeded"
    assert refused.value.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.value.headers["x-ratelimit-reset-requests"] == "1m0s"
    assert "requests per minute (rpm): limit 2" in refused.value.message


async def test_settle_gives_back_what_was_not_used(clock: FakeClock) -> None:
    lim = limiter(clock)
    key = KeyLimits(name="k", tpm=1000, budget_tokens=5000)
    reservation = await lim.admit(key, cost=TokenCost(50, 200))
    reservation.settle(Usage(prompt_tokens=40, completion_tokens=30))
    reservation.settle(Usage(prompt_tokens=999, completion_tokens=999))  # a second settle does nothing
    await settled(lim)
    usage = await lim.store.usage(key, BudgetPeriod.at("day", clock()))
    assert (usage.tokens, usage.budget_used) == (930, 70)


async def test_a_request_without_usage_settles_on_what_reached_the_gateway(clock: FakeClock) -> None:
    lim = limiter(clock)
    key = KeyLimits(name="k", tpm=1000)
    cancelled = await lim.admit(key, cost=TokenCost(50, 200))
    cancelled.settle(None, completion_seen=7)  # a stream the client left after 7 tokens
    failed_early = await lim.admit(key, cost=TokenCost(50, 200))
    failed_early.release()  # nothing reached the gateway: nothing is charged
    await settled(lim)
    assert (await lim.store.usage(key, None)).tokens == 1000 - 57


async def test_a_request_that_can_never_fit_is_refused_at_once(clock: FakeClock) -> None:
    lim = limiter(clock)
    with pytest.raises(KeyLimitExceeded) as refused:
        await lim.admit(KeyLimits(name="k", tpm=100), cost=TokenCost(10, 200))
    assert refused.value.code == "request_too_large" and refused.value.retry_after_s is None
    assert "`tpm` of 100" in refused.value.message


async def test_budget_exhausted_is_insufficient_quota(clock: FakeClock) -> None:
    lim = limiter(clock)
    key = KeyLimits(name="k", budget_tokens=100, budget_period="month")
    await lim.admit(key, cost=TokenCost(10, 80))
    with pytest.raises(BudgetExhausted) as refused:
        await lim.admit(key, cost=TokenCost(10, 10))
    period = BudgetPeriod.at("month", clock())
    assert refused.value.code == "insufficient_quota"
    assert f"90 of its 100 tokens for {period.id}" in refused.value.message
    assert refused.value.retry_after_s == pytest.approx(period.ends_at - clock(), abs=1)


def test_the_reservation_covers_every_choice_and_the_prompt() -> None:
    messages = [{"role": "system", "content": "x" * 40}, {"role": "user", "content": [{"type": "text", "text": "y" * 80}]}]
    spec = RequestSpec(request_id="r", kind="chat", model="m", upstream_model="", messages=messages,
                       sampling=Sampling(n=3, max_tokens=50))
    assert estimate_prompt_tokens(spec) == 120 // 4 + 2 * 4 + 1
    assert request_cost(spec, max_model_len=4096) == TokenCost(39, 150)
    unbounded = RequestSpec(request_id="r", kind="completion", model="m", upstream_model="", prompt=[1, 2, 3], sampling=Sampling())
    assert request_cost(unbounded, max_model_len=100) == TokenCost(3, 97)  # the rest of the context
    assert request_cost(unbounded, max_model_len=None) == TokenCost(3, 0)


@pytest.mark.parametrize("policy", ["allow", "deny"])
async def test_an_unreachable_store_follows_on_state_error(clock: FakeClock, policy: str) -> None:
    """A real Redis client against a port nothing listens on: connection refused."""
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.5)
    lim = limiter(clock, store, on_state_error=policy)
    await lim.start()
    key = KeyLimits(name="k", rpm=10)
    try:
        for _ in range(3):  # the store is asked once; then it rests for STATE_RETRY_S
            if policy == "allow":
                assert await lim.admit(key, cost=TokenCost(0, 0)) is NO_RESERVATION
            else:
                with pytest.raises(StateUnavailable):
                    await lim.admit(key, cost=TokenCost(0, 0))
        assert lim.state_errors.labels("admit")._value.get() == 1
        clock.advance(1.5)
        with pytest.raises(StateUnavailable) if policy == "deny" else contextlib.nullcontext():
            await lim.admit(key, cost=TokenCost(0, 0))
        assert lim.state_errors.labels("admit")._value.get() == 2
    finally:
        await lim.close()


async def test_a_settlement_with_nothing_to_give_back_is_not_sent(clock: FakeClock) -> None:
    lim = limiter(clock)
    rpm_only = await lim.admit(KeyLimits(name="k", rpm=5), cost=TokenCost(0, 0))
    rpm_only.settle(Usage(prompt_tokens=3, completion_tokens=4))  # rpm counts requests, not tokens
    exact = await lim.admit(KeyLimits(name="t", tpm=100), cost=TokenCost(10, 20))
    exact.settle(Usage(prompt_tokens=10, completion_tokens=20))
    assert not lim._pending
