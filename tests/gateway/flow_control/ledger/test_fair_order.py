"""The fair order, step by step, on both ledgers (in process and in a real Redis, on a clock
the test moves): who is served next when a backend with one slot frees it, under two tenants,
weights, bands and aging. The same script gives the same answers on both."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from gateway.flow_control.ledger.base import Entry, Ledger
from gateway.flow_control.ledger.fair_order import entry_id
from gateway.flow_control.ledger.memory_ledger import MemoryLedger
from gateway.flow_control.ledger.redis_ledger import RedisLedger
from gateway.keys.resp import RespClient
from tests.gateway.keys.conftest import FakeClock
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.anyio

COST = 100
MakeLedger = Callable[..., Ledger]


@pytest.fixture(params=["memory", "redis"])
async def make_ledger(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[MakeLedger]:
    """Ledgers of one kind, each for a backend of its own, on the test's clock."""
    if request.param == "memory":
        yield lambda num_bands=3, aging_s=None: MemoryLedger(num_bands, aging_s, clock=clock)
        return
    redis: RedisServer = request.getfixturevalue("redis")
    client = RespClient(redis.url, timeout_s=5.0)
    names = iter(range(1000))
    try:
        yield lambda num_bands=3, aging_s=None: RedisLedger(client, f"backend-{next(names)}", num_bands=num_bands, aging_s=aging_s,
                                                            owner="w1", lease_s=600.0, expiry_s=600.0, clock=clock)
    finally:
        await client.close()


class Script:
    """Entries made with increasing ids, and the order a one-slot backend serves them in."""

    def __init__(self, ledger: Ledger, capacity: int = 1) -> None:
        self.ledger = ledger
        self.capacity = capacity
        self.seq = 0
        self.tenant_of: dict[str, str] = {}

    def entry(self, tenant: str, band: int = 0, cost: int = COST, weight: float = 1.0) -> Entry:
        self.seq += 1
        made = Entry(entry_id(self.seq, self.ledger.owner), tenant, band, cost, weight)
        self.tenant_of[made.id] = tenant
        return made

    async def arrive(self, tenant: str, **kwargs: object) -> str:
        entry = self.entry(tenant, **kwargs)  # type: ignore[arg-type]
        arrival = await self.ledger.arrive(entry, capacity=self.capacity, max_queue=10_000, max_ahead=None)
        return arrival.outcome

    async def serve_all(self, first: str) -> list[str]:
        """Release the slot `first` holds, then each granted entry in turn: the tenants served."""
        order: list[str] = []
        holding = first
        while True:
            woken = await self.ledger.release(holding, self.capacity)
            if not woken:
                return order
            (holding,) = woken
            order.append(self.tenant_of[holding])


async def saturate(script: Script) -> str:
    first = script.entry("warmup")
    assert (await script.ledger.arrive(first, capacity=1, max_queue=10, max_ahead=None)).outcome == "granted"
    return first.id


async def test_room_and_nobody_waiting_is_granted_at_once(make_ledger: MakeLedger) -> None:
    script = Script(make_ledger(), capacity=2)
    assert [await script.arrive("a"), await script.arrive("a")] == ["granted", "granted"]
    assert await script.arrive("b") == "queued"
    assert await script.ledger.waiting() == 1


async def test_a_quiet_tenant_overtakes_a_flood_ten_times_its_size(make_ledger: MakeLedger) -> None:
    script = Script(make_ledger())
    held = await saturate(script)
    for i in range(40):  # A floods: ten of A for each of B
        await script.arrive("A")
        if i % 10 == 9:
            await script.arrive("B")
    order = await script.serve_all(held)
    assert len(order) == 44
    assert [i for i, t in enumerate(order) if t == "B"] == [1, 3, 5, 7]  # one for one, not after A's backlog


async def test_weights_share_a_full_backend_in_tokens(make_ledger: MakeLedger) -> None:
    script = Script(make_ledger())
    held = await saturate(script)
    for _ in range(40):
        await script.arrive("heavy", weight=3.0)
        await script.arrive("light", weight=1.0)
    first_40 = (await script.serve_all(held))[:40]
    assert first_40.count("heavy") == 30 and first_40.count("light") == 10


async def test_costs_are_shared_not_request_counts(make_ledger: MakeLedger) -> None:
    script = Script(make_ledger())
    held = await saturate(script)
    for _ in range(20):
        await script.arrive("long", cost=400)
        await script.arrive("short", cost=100)
    first_10 = (await script.serve_all(held))[:10]
    assert first_10.count("short") == 8 and first_10.count("long") == 2


async def test_a_higher_band_is_served_first(make_ledger: MakeLedger) -> None:
    script = Script(make_ledger())
    held = await saturate(script)
    for _ in range(3):
        await script.arrive("batch", band=2)
        await script.arrive("normal", band=1)
        await script.arrive("urgent", band=0)
    assert await script.serve_all(held) == ["urgent"] * 3 + ["normal"] * 3 + ["batch"] * 3


async def test_aging_lifts_a_waiting_request_one_band_per_period(make_ledger: MakeLedger, clock: FakeClock) -> None:
    ledger = make_ledger(aging_s=10.0)
    script = Script(ledger)
    held = await saturate(script)
    await script.arrive("batch", band=2)
    clock.advance(10.0)
    await script.arrive("urgent", band=0)
    await script.arrive("normal", band=1)
    await script.arrive("late", band=2)
    assert await script.serve_all(held) == ["urgent", "batch", "normal", "late"]  # batch is in band 1 now


async def test_aging_lifts_a_low_band_above_newer_top_band_requests(make_ledger: MakeLedger, clock: FakeClock) -> None:
    ledger = make_ledger(aging_s=10.0)
    script = Script(ledger)
    held = await saturate(script)
    await script.arrive("batch", band=2)
    clock.advance(20.0)  # two periods: the top band, where its older tag comes first
    for _ in range(5):
        await script.arrive("urgent", band=0)
    assert (await script.serve_all(held))[0] == "batch"


async def test_strict_bands_starve_the_low_band_without_aging(make_ledger: MakeLedger, clock: FakeClock) -> None:
    ledger = make_ledger()
    script = Script(ledger)
    held = await saturate(script)
    low = script.entry("batch", band=2)
    await ledger.arrive(low, capacity=1, max_queue=100, max_ahead=None)
    clock.advance(300.0)  # long, but within the leases and expiries a Redis ledger keeps
    for _ in range(5):
        await script.arrive("urgent", band=0)
    assert (await script.serve_all(held))[-1] == "batch"


async def test_aging_climbs_several_bands_at_once(make_ledger: MakeLedger, clock: FakeClock) -> None:
    ledger = make_ledger(num_bands=4, aging_s=5.0)
    script = Script(ledger)
    held = await saturate(script)
    await script.arrive("batch", band=3)
    clock.advance(12.0)  # two whole periods: band 1
    await script.arrive("top", band=0)
    await script.arrive("second", band=1)
    assert await script.serve_all(held) == ["top", "batch", "second"]


async def test_ahead_counts_what_would_be_served_first(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    script = Script(ledger)
    await saturate(script)
    for _ in range(5):
        await ledger.arrive(script.entry("A", band=1), capacity=1, max_queue=100, max_ahead=None)
    await ledger.arrive(script.entry("U", band=0, cost=50), capacity=1, max_queue=100, max_ahead=None)
    quiet = await ledger.arrive(script.entry("B", band=1), capacity=1, max_queue=100, max_ahead=None)
    assert quiet.ahead == 50 + COST  # the band above, and A's first (same tag, earlier id); not A's backlog
    flood = await ledger.arrive(script.entry("A", band=1), capacity=1, max_queue=100, max_ahead=None)
    assert flood.ahead == 50 + 6 * COST


async def test_refusals_count_nothing(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    script = Script(ledger)
    await saturate(script)
    await ledger.arrive(script.entry("A"), capacity=1, max_queue=100, max_ahead=None)
    refused = await ledger.arrive(script.entry("B"), capacity=1, max_queue=100, max_ahead=COST - 1)
    assert (refused.outcome, refused.ahead) == ("slo", COST)
    full = await ledger.arrive(script.entry("B"), capacity=1, max_queue=1, max_ahead=None)
    assert (full.outcome, full.ahead) == ("queue_full", COST)
    assert await ledger.waiting() == 1
    for _ in range(2):
        await ledger.arrive(script.entry("A"), capacity=1, max_queue=100, max_ahead=None)
    again = await ledger.arrive(script.entry("B"), capacity=1, max_queue=100, max_ahead=None)
    assert again.ahead == COST  # B's tag is still the virtual clock: the refusals did not move it


async def test_withdraw_and_release_free_a_slot_once(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    script = Script(ledger, capacity=1)
    held = await saturate(script)
    waiting = script.entry("A")
    later = script.entry("B")
    await ledger.arrive(waiting, capacity=1, max_queue=100, max_ahead=None)
    await ledger.arrive(later, capacity=1, max_queue=100, max_ahead=None)
    assert await ledger.withdraw(waiting.id, 1) == ()  # gone from the queue; nothing freed
    assert await ledger.release(held, 1) == (later.id,)
    assert await ledger.release(held, 1) == ()  # twice: nothing more
    assert await ledger.withdraw(later.id, 1) == ()  # a granted entry withdrawn is released
    assert (await script.arrive("C")) == "granted"  # nothing runs, nothing waits
