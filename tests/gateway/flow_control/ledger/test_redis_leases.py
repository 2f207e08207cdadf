"""The Redis ledger's leases and claims keep the top band's count (`running_top`) in step with
`running`: a top-band grant whose worker died stops counting against the lower bands' capacity
when its lease lapses, and one collected by its worker keeps counting as the top band's for its
whole lease — so the lower bands hold exactly `capacity` in both cases (a real redis-server, on
a clock the test moves)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.flow_control.ledger.base import Entry, Grant
from gateway.flow_control.ledger.fair_order import entry_id
from gateway.flow_control.ledger.redis_ledger import RedisLedger
from gateway.keys.resp import RespClient
from tests.gateway.keys.conftest import FakeClock
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.anyio

ROOM = {"capacity": 1, "top_capacity": 2}
LEASE_S = 60.0
CLAIM_S = 5.0


@pytest.fixture
async def client(redis: RedisServer) -> AsyncIterator[RespClient]:
    client = RespClient(redis.url, timeout_s=5.0)
    try:
        yield client
    finally:
        await client.close()


def ledger(client: RespClient, owner: str, clock: FakeClock) -> RedisLedger:
    return RedisLedger(client, "leases", num_bands=3, aging_s=None, owner=owner, lease_s=LEASE_S, expiry_s=600.0,
                       claim_s=CLAIM_S, clock=clock)


def entry(seq: int, owner: str, band: int) -> Entry:
    return Entry(entry_id(seq, owner), "A", band, 100, 1.0)


async def arrive(on: RedisLedger, what: Entry) -> str:
    return (await on.arrive(what, max_queue=100, max_ahead=None, **ROOM)).outcome


async def test_a_lapsed_top_band_lease_no_longer_counts_as_the_top_bands(client: RespClient, clock: FakeClock) -> None:
    w1 = ledger(client, "w1", clock)
    assert await arrive(w1, entry(1, "w1", 0)) == "granted"  # its worker then dies: the lease lapses
    clock.advance(LEASE_S + 1.0)
    assert await arrive(w1, entry(2, "w1", 1)) == "granted"
    assert await arrive(w1, entry(3, "w1", 1)) == "queued"  # the lower bands' one slot is taken
    assert await client.call("ZCARD", "switchyard:flow:{leases}:running_top") == 0


async def test_a_collected_top_band_grant_counts_as_the_top_bands_for_its_whole_lease(client: RespClient, clock: FakeClock) -> None:
    w1, w2 = ledger(client, "w1", clock), ledger(client, "w2", clock)
    low, top = entry(1, "w1", 1), entry(2, "w1", 0)
    assert [await arrive(w1, low), await arrive(w1, top)] == ["granted", "granted"]  # the capacity and the headroom
    theirs = entry(3, "w2", 0)
    assert await arrive(w2, theirs) == "queued"
    assert await w1.release(top.id, **ROOM) == ()  # granted to w2's entry, on a claim
    assert await w2.dispatch(**ROOM) == (Grant(theirs.id, into_headroom=True),)  # collected: the full lease
    clock.advance(CLAIM_S + 1.0)  # past the claim, within the lease
    await w1.release(low.id, **ROOM)
    assert await arrive(w1, entry(4, "w1", 1)) == "granted"  # the lower bands' slot is free: w2's runs in the top band
    assert await arrive(w1, entry(5, "w1", 1)) == "queued"
