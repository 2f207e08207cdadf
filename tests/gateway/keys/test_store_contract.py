"""Both state stores run one algorithm: the same script of admissions and settlements, on a
clock the test moves, gives the same exact numbers in this process and in a real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.keys.limits import BudgetPeriod, KeyLimits
from gateway.keys.redis_store import RedisStore
from gateway.keys.store import MemoryStore, StateStore
from tests.gateway.keys.conftest import FakeClock
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.anyio

LEASE_S = 30.0


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[StateStore]:
    if request.param == "memory":
        made: StateStore = MemoryStore(clock=clock)
    else:
        redis: RedisServer = request.getfixturevalue("redis")
        made = RedisStore(redis.url, timeout_s=5.0, clock=clock)
    await made.start()
    try:
        yield made
    finally:
        await made.close()


def period(limits: KeyLimits, clock: FakeClock) -> BudgetPeriod | None:
    return BudgetPeriod.at(limits.budget_period, clock()) if limits.budget_tokens else None


async def test_rpm_bursts_to_the_limit_then_refills_at_its_rate(store: StateStore, clock: FakeClock) -> None:
    limits = KeyLimits(name="k", rpm=5)
    levels = [(await store.admit(limits, 0, f"r{i}", LEASE_S, None)).requests for i in range(5)]
    assert levels == [4, 3, 2, 1, 0]
    refused = await store.admit(limits, 0, "r5", LEASE_S, None)
    assert refused.refused == "requests"
    assert refused.retry_after_s == pytest.approx(12.0)  # one request per 60/5 s
    clock.advance(12.0)
    assert (await store.admit(limits, 0, "r6", LEASE_S, None)).refused is None
    assert (await store.admit(limits, 0, "r7", LEASE_S, None)).refused == "requests"


async def test_tpm_reserves_then_settles_on_the_real_usage(store: StateStore, clock: FakeClock) -> None:
    limits = KeyLimits(name="k", tpm=100)
    first = await store.admit(limits, 30, "a", LEASE_S, None)
    assert (first.refused, first.tokens) == (None, 70)
    await store.settle(limits, "a", 30, 10, None)  # used 10 of the 30 reserved
    assert (await store.usage(limits, None)).tokens == pytest.approx(90)
    refused = await store.admit(limits, 95, "b", LEASE_S, None)
    assert refused.refused == "tokens"
    assert refused.retry_after_s == pytest.approx(3.0)  # 5 more tokens at 100/60 per second
    clock.advance(3.0)
    assert (await store.admit(limits, 95, "b", LEASE_S, None)).tokens == pytest.approx(0)


async def test_usage_over_the_reservation_is_owed(store: StateStore, clock: FakeClock) -> None:
    limits = KeyLimits(name="k", tpm=100)
    await store.admit(limits, 50, "a", LEASE_S, None)
    await store.settle(limits, "a", 50, 120, None)  # the upstream used more than estimated
    assert (await store.usage(limits, None)).tokens == pytest.approx(-20)
    assert (await store.admit(limits, 1, "b", LEASE_S, None)).refused == "tokens"
    clock.advance(13.0)  # 21.67 tokens refilled: back above the one asked for
    assert (await store.admit(limits, 1, "b", LEASE_S, None)).refused is None


async def test_a_refusal_counts_nothing(store: StateStore, clock: FakeClock) -> None:
    limits = KeyLimits(name="k", rpm=10, tpm=50, max_parallel=5, budget_tokens=1000)
    p = period(limits, clock)
    assert (await store.admit(limits, 60, "a", LEASE_S, p)).refused == "tokens"
    usage = await store.usage(limits, p)
    assert (usage.requests, usage.tokens, usage.in_flight, usage.budget_used) == (10, 50, 0, 0)


async def test_max_parallel_counts_unsettled_reservations_and_leases_expire(store: StateStore, clock: FakeClock) -> None:
    limits = KeyLimits(name="k", max_parallel=2)
    assert (await store.admit(limits, 0, "a", LEASE_S, None)).refused is None
    assert (await store.admit(limits, 0, "b", LEASE_S, None)).refused is None
    assert (await store.admit(limits, 0, "c", LEASE_S, None)).refused == "parallel"
    await store.settle(limits, "a", 0, 0, None)
    assert (await store.usage(limits, None)).in_flight == 1
    assert (await store.admit(limits, 0, "c", LEASE_S, None)).refused is None
    clock.advance(LEASE_S + 1)  # a gateway died holding b and c: their leases run out
    assert (await store.usage(limits, None)).in_flight == 0
    assert (await store.admit(limits, 0, "d", LEASE_S, None)).refused is None


async def test_budget_counts_per_period_and_settles(store: StateStore, clock: FakeClock) -> None:
    limits = KeyLimits(name="k", budget_tokens=100, budget_period="day")
    p = period(limits, clock)
    assert p is not None
    assert (await store.admit(limits, 60, "a", LEASE_S, p)).budget_used == 60
    refused = await store.admit(limits, 50, "b", LEASE_S, p)
    assert refused.refused == "budget"
    assert refused.retry_after_s == pytest.approx(p.ends_at - clock())
    await store.settle(limits, "a", 60, 20, p)
    assert (await store.usage(limits, p)).budget_used == 20
    assert (await store.admit(limits, 50, "b", LEASE_S, p)).budget_used == 70
    clock.advance(p.ends_at - clock() + 1)  # the next day: a fresh budget
    tomorrow = period(limits, clock)
    assert tomorrow is not None and tomorrow.id != p.id
    assert (await store.usage(limits, tomorrow)).budget_used == 0
    assert (await store.admit(limits, 100, "c", LEASE_S, tomorrow)).budget_used == 100


async def test_keys_are_counted_apart(store: StateStore, clock: FakeClock) -> None:
    a, b = KeyLimits(name="a", rpm=1), KeyLimits(name="b", rpm=1)
    assert (await store.admit(a, 0, "1", LEASE_S, None)).refused is None
    assert (await store.admit(b, 0, "2", LEASE_S, None)).refused is None
    assert (await store.admit(a, 0, "3", LEASE_S, None)).refused == "requests"


async def test_redis_admits_exactly_the_limit_under_concurrent_clients(redis: RedisServer) -> None:
    """Two clients (as two gateway processes would be) racing for one key's last requests:
    the script checks and counts in one step, so exactly the limit gets through."""
    stores = [RedisStore(redis.url, timeout_s=5.0), RedisStore(redis.url, timeout_s=5.0)]
    for s in stores:
        await s.start()
    try:
        limits = KeyLimits(name="shared", rpm=20, max_parallel=1000)
        results = await asyncio.gather(*(stores[i % 2].admit(limits, 0, f"r{i}", LEASE_S, None) for i in range(60)))
        admitted = sum(1 for r in results if r.refused is None)
        assert 20 <= admitted <= 21  # one more only if Redis's clock crossed a 3 s refill meanwhile
        assert (await stores[0].usage(limits, None)).in_flight == admitted
    finally:
        for s in stores:
            await s.close()
