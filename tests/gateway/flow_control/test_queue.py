"""`FlowQueue` on the in-process ledger, driven through real asyncio tasks: straight through
while there is room, fair order when full, bands, SLO shedding, timeouts, and waiters that leave
(cancelled, timed out, drained) without leaking a slot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.errors import DeadlineExceeded, QueueShed, ShuttingDown, error_payload
from gateway.flow_control.ledger.memory_ledger import MemoryLedger
from gateway.flow_control.queue import Ask, FlowQueue, QueueLimits
from gateway.flow_control.stats import FlowCounters
from gateway.service.admission import Deadline
from tests.gateway.flow_control.driving import Backend, Served, until
from tests.gateway.keys.conftest import FakeClock

pytestmark = pytest.mark.anyio

NO_POLL = QueueLimits(poll_interval_s=3600.0)  # the test moves every slot itself


@pytest.fixture
def backend() -> Backend:
    return Backend()


@pytest.fixture
async def queue(backend: Backend) -> AsyncIterator[FlowQueue]:
    made = FlowQueue("b", MemoryLedger(num_bands=3, aging_s=None), backend.capacity, has_room=backend.has_room, limits=NO_POLL)
    try:
        yield made
    finally:
        await made.close()


def ledger_of(queue: FlowQueue) -> MemoryLedger:
    assert isinstance(queue.ledger, MemoryLedger)
    return queue.ledger


async def test_with_room_a_request_is_granted_without_waiting(queue: FlowQueue, backend: Backend) -> None:
    backend.slots = 2
    for _ in range(2):
        admission = queue.admit(Ask("a", 1, 100))
        with pytest.raises(StopIteration) as done:  # finished in one go: never yielded to the event loop
            admission.send(None)
        ticket = done.value.value
        assert (ticket.queued_s, ticket.queued_ms) == (None, None)
    assert queue.num_waiting == 0
    assert isinstance(queue.observer, FlowCounters) and queue.observer.admissions[("a", "immediate")] == 2


async def test_a_full_backend_queues_and_a_release_hands_the_slot_on(queue: FlowQueue) -> None:
    first = await queue.admit(Ask("a", 1, 100))
    waiter = asyncio.get_running_loop().create_task(queue.admit(Ask("b", 1, 100)))
    await until(lambda: queue.num_waiting == 1)
    assert queue.depth == {("b", 1): 1}
    first.release()
    second = await waiter
    assert second.queued_s is not None and second.queued_ms is not None
    assert ledger_of(queue).running == {second.entry.id}
    second.release()
    second.release()
    await until(lambda: not ledger_of(queue).running)


async def test_the_quiet_tenant_overtakes_the_flood(queue: FlowQueue) -> None:
    holding = await queue.admit(Ask("warmup", 1, 100))
    served = Served(queue)
    for i in range(30):
        served.wait_for(Ask("flood", 1, 100))
        if i % 10 == 9:
            served.wait_for(Ask("quiet", 1, 100))
    await until(lambda: queue.num_waiting == 33)
    order = await served.serve_in_turn(holding, 33)
    assert [i for i, t in enumerate(order) if t == "quiet"] == [1, 3, 5]


async def test_weights_hold_between_backlogged_tenants(queue: FlowQueue) -> None:
    holding = await queue.admit(Ask("warmup", 1, 100))
    served = Served(queue)
    for _ in range(20):
        served.wait_for(Ask("gold", 1, 100, weight=4.0))
        served.wait_for(Ask("basic", 1, 100, weight=1.0))
    await until(lambda: queue.num_waiting == 40)
    first_20 = (await served.serve_in_turn(holding, 40))[:20]
    assert (first_20.count("gold"), first_20.count("basic")) == (16, 4)


async def test_a_higher_band_is_served_first(queue: FlowQueue) -> None:
    holding = await queue.admit(Ask("warmup", 1, 100))
    served = Served(queue)
    for tenant, band in (("batch", 2), ("normal", 1), ("urgent", 0)):
        served.wait_for(Ask(tenant, band, 100))
    await until(lambda: queue.num_waiting == 3)
    assert await served.serve_in_turn(holding, 3) == ["urgent", "normal", "batch"]


async def test_aging_releases_the_low_band(backend: Backend, clock: FakeClock) -> None:
    queue = FlowQueue("b", MemoryLedger(num_bands=3, aging_s=10.0, clock=clock), backend.capacity, limits=NO_POLL)
    try:
        holding = await queue.admit(Ask("warmup", 1, 100))
        served = Served(queue)
        served.wait_for(Ask("batch", 2, 100))
        await until(lambda: queue.num_waiting == 1)
        clock.advance(20.0)  # two aging periods: band 2 -> band 0
        for _ in range(3):
            served.wait_for(Ask("urgent", 0, 100))
        await until(lambda: queue.num_waiting == 4)
        assert (await served.serve_in_turn(holding, 4))[0] == "batch"
    finally:
        await queue.close()


async def test_a_request_predicted_to_miss_its_slo_is_refused_at_once(queue: FlowQueue) -> None:
    queue.rate.observe(cost=1000, held_s=1.0)  # one slot gets through 1000 tokens a second
    holding = await queue.admit(Ask("flood", 1, 1000))
    served = Served(queue)
    for _ in range(3):
        served.wait_for(Ask("flood", 1, 1000))
    await until(lambda: queue.num_waiting == 3)
    quiet = served.wait_for(Ask("quiet", 1, 1000, slo_s=2.0))  # its tag is the virtual clock: nothing ahead
    await until(lambda: queue.num_waiting == 4)
    with pytest.raises(QueueShed) as shed:
        await queue.admit(Ask("flood", 1, 1000, slo_s=2.0))  # the whole backlog is ahead: ~4 s
    error = shed.value
    assert (error.reason, error.code, error.retry_after_s) == ("slo", "queue_wait_over_slo", 4.0)
    status, payload = error_payload(error)
    assert (status, payload.error.type) == (429, "rate_limit_error")
    assert queue.num_waiting == 4  # nothing was queued for it
    await served.serve_in_turn(holding, 4)
    assert not quiet.cancelled() and quiet.result().queued_s is not None


async def test_without_a_measured_rate_nothing_is_refused_for_a_prediction(queue: FlowQueue) -> None:
    holding = await queue.admit(Ask("a", 1, 1000))
    waiter = asyncio.get_running_loop().create_task(queue.admit(Ask("a", 1, 1000, slo_s=0.001)))
    await until(lambda: queue.num_waiting == 1)
    holding.release()
    (await waiter).release()


async def test_a_full_queue_refuses_at_once(backend: Backend) -> None:
    queue = FlowQueue("b", MemoryLedger(num_bands=3, aging_s=None), backend.capacity,
                      limits=QueueLimits(max_queue=2, poll_interval_s=3600.0))
    try:
        holding = await queue.admit(Ask("a", 1, 100))
        served = Served(queue)
        served.wait_for(Ask("a", 1, 100))
        served.wait_for(Ask("b", 1, 100))
        await until(lambda: queue.num_waiting == 2)
        with pytest.raises(QueueShed) as shed:
            await queue.admit(Ask("c", 1, 100))
        assert (shed.value.reason, shed.value.code, shed.value.retry_after_s) == ("queue_full", "queue_full", 1.0)
        await served.serve_in_turn(holding, 2)
    finally:
        await queue.close()


async def test_a_wait_past_queue_timeout_is_a_429_and_leaves_no_trace(backend: Backend) -> None:
    queue = FlowQueue("b", MemoryLedger(num_bands=3, aging_s=None), backend.capacity,
                      limits=QueueLimits(queue_timeout_s=0.01, poll_interval_s=3600.0))
    try:
        holding = await queue.admit(Ask("a", 1, 100))
        with pytest.raises(QueueShed) as shed:
            await queue.admit(Ask("b", 1, 100))
        assert shed.value.reason == "timeout"
        assert queue.num_waiting == 0 and await queue.ledger.waiting() == 0
        assert isinstance(queue.observer, FlowCounters) and queue.observer.sheds[("b", "timeout")] == 1
        holding.release()
        await until(lambda: not ledger_of(queue).running)
    finally:
        await queue.close()


async def test_the_request_deadline_ends_the_wait_with_its_own_error(queue: FlowQueue) -> None:
    holding = await queue.admit(Ask("a", 1, 100))
    with pytest.raises(DeadlineExceeded):
        await queue.admit(Ask("b", 1, 100), Deadline(at=asyncio.get_running_loop().time() + 0.01, timeout_s=0.01))
    assert await queue.ledger.waiting() == 0
    holding.release()


async def test_a_client_that_goes_away_while_queued_frees_its_place(queue: FlowQueue) -> None:
    holding = await queue.admit(Ask("warmup", 1, 100))
    served = Served(queue)
    leaving = served.wait_for(Ask("a", 1, 100))
    staying = served.wait_for(Ask("b", 1, 100))
    await until(lambda: queue.num_waiting == 2)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert queue.depth == {("b", 1): 1} and await queue.ledger.waiting() == 1
    assert isinstance(queue.observer, FlowCounters) and queue.observer.sheds[("a", "cancelled")] == 1
    holding.release()
    ticket = await staying
    assert ledger_of(queue).running == {ticket.entry.id}


async def test_a_grant_that_meets_a_cancellation_is_passed_on(queue: FlowQueue) -> None:
    holding = await queue.admit(Ask("warmup", 1, 100))
    served = Served(queue)
    unlucky = served.wait_for(Ask("a", 1, 100))
    next_in_line = served.wait_for(Ask("b", 1, 100))
    await until(lambda: queue.num_waiting == 2)
    holding.release()  # grants `unlucky` at once; it would resume on the next turn...
    assert len(ledger_of(queue).running) == 1 and holding.entry.id not in ledger_of(queue).running
    unlucky.cancel()  # ...but is cancelled before it could
    with pytest.raises(asyncio.CancelledError):
        await unlucky
    ticket = await next_in_line
    assert ledger_of(queue).running == {ticket.entry.id}  # the slot went on, not lost


async def test_cancelled_at_every_turn_of_its_admission_no_slot_leaks(queue: FlowQueue, backend: Backend) -> None:
    for turns in range(6):
        holding = await queue.admit(Ask("warmup", 1, 100))
        waiter = asyncio.get_running_loop().create_task(queue.admit(Ask("a", 1, 100)))
        for _ in range(turns):
            await asyncio.sleep(0)
        if turns == 3:
            holding.release()
        waiter.cancel()
        try:
            (await waiter).release()
        except asyncio.CancelledError:
            pass
        holding.release()
        await until(lambda: not ledger_of(queue).running and not ledger_of(queue)._waiting, f"a clean ledger after {turns} turns")


async def test_the_drain_ends_every_waiter(queue: FlowQueue) -> None:
    holding = await queue.admit(Ask("warmup", 1, 100))
    served = Served(queue)
    waiters = [served.wait_for(Ask("a", 1, 100)) for _ in range(3)]
    await until(lambda: queue.num_waiting == 3)
    queue.fail_waiters(ShuttingDown())
    for waiter in waiters:
        with pytest.raises(ShuttingDown):
            await waiter
    assert await queue.ledger.waiting() == 0
    holding.release()


async def test_more_capacity_serves_waiters_when_poked(queue: FlowQueue, backend: Backend) -> None:
    holding = await queue.admit(Ask("a", 1, 100))
    waiter = asyncio.get_running_loop().create_task(queue.admit(Ask("b", 1, 100)))
    await until(lambda: queue.num_waiting == 1)
    backend.slots = 2
    queue.poke()
    (await waiter).release()
    holding.release()


async def test_engines_that_report_no_room_hold_requests_whatever_the_count(queue: FlowQueue, backend: Backend) -> None:
    backend.slots, backend.room = 8, False
    waiter = asyncio.get_running_loop().create_task(queue.admit(Ask("a", 1, 100)))
    await until(lambda: queue.num_waiting == 1)
    assert not ledger_of(queue).running
    backend.room = True
    queue.poke()
    (await waiter).release()


async def test_the_poll_notices_capacity_nobody_announced(backend: Backend) -> None:
    queue = FlowQueue("b", MemoryLedger(num_bands=3, aging_s=None), backend.capacity, limits=QueueLimits(poll_interval_s=0.001))
    try:
        holding = await queue.admit(Ask("a", 1, 100))
        waiter = asyncio.get_running_loop().create_task(queue.admit(Ask("b", 1, 100)))
        await until(lambda: queue.num_waiting == 1)
        backend.slots = 2  # no poke: the poll finds it
        (await waiter).release()
        holding.release()
    finally:
        await queue.close()


async def test_the_slot_context_releases_on_the_way_out(queue: FlowQueue) -> None:
    with pytest.raises(RuntimeError):
        async with queue.slot(Ask("a", 1, 100)) as ticket:
            assert ledger_of(queue).running == {ticket.entry.id}
            raise RuntimeError("the request failed")
    await until(lambda: not ledger_of(queue).running)
