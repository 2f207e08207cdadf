"""The top band's headroom through a real `FlowQueue` (in process and on a real Redis): a band-0
request is granted at once while a flood fills every ordinary slot and waits behind it; the
flood alone never runs past the backend's capacity, yet keeps it while the top band runs; a
flood's backlog aged into the top band is served first among the ordinary slots but never in the
headroom; the headroom opens only while some replica has room within it; a shadow copy never
takes it; each grant into it is counted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.flow_control.ledger.memory_ledger import MemoryLedger
from gateway.flow_control.ledger.redis_ledger import RedisLedger
from gateway.flow_control.metrics import FlowMetrics
from gateway.flow_control.queue import Ask, FlowQueue, Headroom, QueueLimits, Ticket
from gateway.flow_control.stats import FlowCounters
from gateway.keys.resp import RespClient
from tests.gateway.flow_control.driving import Backend, until
from tests.gateway.keys.conftest import FakeClock
from tests.support.probes import metric
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.anyio

NO_POLL = QueueLimits(poll_interval_s=3600.0)  # the test moves every slot itself
SETTLE_S = 30.0
FLOOD, URGENT = 1, 0  # bands


@dataclass
class Spare:
    """The top band's readings, set by the test."""

    slots: int = 1
    room: bool = True

    def headroom(self) -> Headroom:
        return Headroom(lambda: self.slots, lambda: self.room)


@pytest.fixture
async def queue() -> AsyncIterator[FlowQueue]:
    made = FlowQueue("b", MemoryLedger(num_bands=3, aging_s=None), Backend(slots=2).capacity, headroom=Spare().headroom(),
                     limits=NO_POLL)
    try:
        yield made
    finally:
        await made.close()


async def settle(condition: Callable[[], bool], what: str) -> None:
    """Let a shared ledger's round trips happen until `condition()` holds (bounded in time)."""
    deadline = asyncio.get_running_loop().time() + SETTLE_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"{what} did not happen within {SETTLE_S} s"
        await asyncio.sleep(0.005)


def running(queue: FlowQueue) -> int:
    assert isinstance(queue.ledger, MemoryLedger)
    return len(queue.ledger.running)


async def flood(queue: FlowQueue, count: int) -> tuple[list[Ticket], list[asyncio.Task[Ticket]]]:
    """`count` band-1 requests: the first ones granted at once, the rest waiting."""
    granted, waiting = [], []
    for _ in range(count):
        task = asyncio.get_running_loop().create_task(queue.admit(Ask("flood", FLOOD, 100)))
        await until(lambda: task.done() or queue.num_waiting > len(waiting))
        (granted if task.done() else waiting).append(task)
    return [task.result() for task in granted], waiting


async def test_a_top_band_request_is_granted_at_once_while_the_flood_fills_every_slot(queue: FlowQueue) -> None:
    holding, backlog = await flood(queue, 5)
    assert (len(holding), len(backlog)) == (2, 3)  # the flood keeps its two slots, and no more
    admission = queue.admit(Ask("quiet", URGENT, 100))
    with pytest.raises(StopIteration) as done:  # granted in one go: it never waited
        admission.send(None)
    ticket = done.value.value
    assert (ticket.queued_s, ticket.into_headroom, running(queue)) == (None, True, 3)
    assert isinstance(queue.observer, FlowCounters) and queue.observer.into_headroom == {("quiet", URGENT): 1}
    for each in (*holding, ticket):
        each.release()
    for task in backlog:
        (await task).release()


async def test_the_flood_alone_never_runs_past_the_capacity(queue: FlowQueue) -> None:
    holding, backlog = await flood(queue, 6)
    queue.poke()
    await until(lambda: queue.num_waiting == 4)
    assert running(queue) == 2
    holding[0].release()
    next_one = await backlog[0]
    assert (running(queue), next_one.into_headroom) == (2, False)
    for each in (holding[1], next_one):
        each.release()
    for task in backlog[1:]:
        (await task).release()


async def test_a_flood_aged_into_the_top_band_keeps_to_the_ordinary_slots(clock: FakeClock) -> None:
    """The flood's backlog, once it has waited `aging_s`, is in band 0: served before a newer
    request of a lower band, yet only within the backend's capacity — the headroom stays the
    interactive requests' (bench/README.md, flow control run 3, where it was not)."""
    ledger = MemoryLedger(num_bands=3, aging_s=30.0, clock=clock)
    queue = FlowQueue("b", ledger, Backend(slots=2).capacity, headroom=Spare().headroom(), limits=NO_POLL)
    try:
        holding, backlog = await flood(queue, 4)
        clock.advance(30.0)  # one period: the backlog is in band 0 at the next step
        queue.poke()
        assert (running(queue), await ledger.waiting()) == (2, 2)  # the headroom is free, and stays so
        batch = asyncio.get_running_loop().create_task(queue.admit(Ask("batch", FLOOD, 100)))  # an earlier tag, in band 1
        await until(lambda: queue.num_waiting == 3)
        urgent = await queue.admit(Ask("quiet", URGENT, 100))
        assert (urgent.queued_s, urgent.into_headroom, running(queue)) == (None, True, 3)
        holding[0].release()
        first = await backlog[0]  # band 0 by aging: before the batch request, in the flood's own slot
        assert (first.into_headroom, running(queue), batch.done()) == (False, 3, False)
        urgent.release()
        assert (running(queue), await ledger.waiting()) == (2, 2)  # its headroom slot is nobody's in band 0 by aging
        assert isinstance(queue.observer, FlowCounters) and queue.observer.into_headroom == {("quiet", URGENT): 1}
        for each in (holding[1], first):
            each.release()
        (await backlog[1]).release()
        (await batch).release()
    finally:
        await queue.close()


async def test_a_flood_request_ending_beside_a_top_band_one_hands_its_slot_to_the_flood() -> None:
    """One replica of concurrency 2 and headroom 1 whose load is what the queue granted: once
    the top band runs, the engine's ordinary reading (load below 2) says full, yet the flood's
    second slot is the flood's — the replica's headroom holds it."""
    ledger = MemoryLedger(num_bands=3, aging_s=None)
    load = lambda: len(ledger.running)  # noqa: E731
    queue = FlowQueue("b", ledger, Backend(slots=2).capacity, has_room=lambda: load() < 2,
                      headroom=Headroom(lambda: 1, lambda: load() < 3), limits=NO_POLL)
    try:
        holding, backlog = await flood(queue, 3)
        urgent = await queue.admit(Ask("quiet", URGENT, 100))
        assert (urgent.into_headroom, load()) == (True, 3)
        holding[0].release()
        await until(lambda: backlog[0].done(), "the flood's next request granted")
        assert (load(), backlog[0].result().into_headroom) == (3, False)
        for each in (holding[1], urgent, backlog[0].result()):
            each.release()
    finally:
        await queue.close()


async def test_a_waiting_top_band_request_takes_the_headroom_once_a_replica_has_room() -> None:
    spare = Spare()
    registry = CollectorRegistry()
    queue = FlowQueue("b", MemoryLedger(num_bands=3, aging_s=None), Backend(slots=1).capacity, headroom=spare.headroom(),
                      limits=NO_POLL, observer=FlowMetrics(registry, tenants_bounded=True))
    try:
        holding = await queue.admit(Ask("flood", FLOOD, 100))
        spare.room = False  # every replica at its concurrency plus its headroom
        urgent = asyncio.get_running_loop().create_task(queue.admit(Ask("quiet", URGENT, 100)))
        await until(lambda: queue.num_waiting == 1)
        spare.room = True
        queue.poke()
        ticket = await urgent
        assert ticket.into_headroom and ticket.queued_s is not None
        text = generate_latest(registry).decode()
        assert metric(text, "switchyard_flow_headroom_grants_total", backend="b", tenant="quiet", band="0") == 1
        assert metric(text, "switchyard_flow_headroom_grants_total", tenant="flood") == 0
        holding.release()
        ticket.release()
    finally:
        await queue.close()


async def test_a_shadow_copy_never_takes_the_headroom(queue: FlowQueue) -> None:
    holding, _ = await flood(queue, 2)
    assert await queue.try_admit(Ask("quiet", URGENT, 100)) is None
    assert running(queue) == 2
    for each in holding:
        each.release()


async def test_the_headroom_on_a_shared_ledger(redis: RedisServer) -> None:
    client = RespClient(redis.url, timeout_s=5.0)
    ledger = RedisLedger(client, "b", num_bands=3, aging_s=None, owner="w1", lease_s=600.0, expiry_s=600.0)
    queue = FlowQueue("b", ledger, lambda: 1, headroom=Spare().headroom(), limits=QueueLimits(poll_interval_s=0.005))
    try:
        holding = await queue.admit(Ask("flood", FLOOD, 100))
        waiting = asyncio.get_running_loop().create_task(queue.admit(Ask("flood", FLOOD, 100)))
        await settle(lambda: queue.num_waiting == 1, "the flood's second request waiting")
        ticket = await queue.admit(Ask("quiet", URGENT, 100))
        assert (ticket.queued_s, ticket.into_headroom) == (None, True)
        later = asyncio.get_running_loop().create_task(queue.admit(Ask("quiet", URGENT, 100)))
        await settle(lambda: queue.num_waiting == 2, "the second band-0 request waiting")
        ticket.release()  # its headroom slot goes to the next of band 0, not to the flood
        assert (await later).into_headroom
        assert not waiting.done()
        holding.release()
        (await later).release()
        (await waiting).release()
    finally:
        await queue.close()
        await client.close()
