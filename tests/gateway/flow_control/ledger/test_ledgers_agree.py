"""The in-process ledger and the Redis ledger are one algorithm: a long random script of
arrivals, releases, withdrawals, dispatches and clock moves, with bands, aging, weights, costs
and SLO bounds, gets the same answer from both at every step."""

from __future__ import annotations

import random

import pytest

from gateway.flow_control.ledger.base import Entry
from gateway.flow_control.ledger.fair_order import entry_id
from gateway.flow_control.ledger.memory_ledger import MemoryLedger
from gateway.flow_control.ledger.redis_ledger import RedisLedger
from gateway.keys.resp import RespClient
from tests.gateway.keys.conftest import FakeClock
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.anyio

STEPS = 400


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_both_ledgers_answer_every_step_alike(redis: RedisServer, clock: FakeClock, seed: int) -> None:
    rng = random.Random(seed)
    memory = MemoryLedger(3, 5.0, clock=clock, owner="w1")
    client = RespClient(redis.url, timeout_s=5.0)
    shared = RedisLedger(client, "agree", num_bands=3, aging_s=5.0, owner="w1", lease_s=3600.0, expiry_s=3600.0, clock=clock)
    running: list[str] = []
    waiting: list[str] = []
    try:
        for seq in range(STEPS):
            capacity = rng.randint(1, 4)
            roll = rng.random()
            if roll < 0.5:
                entry = Entry(entry_id(seq, "w1"), rng.choice("ABCD"), rng.randint(0, 2), rng.randint(1, 500), rng.choice([0.5, 1.0, 2.5]))
                max_ahead = rng.choice([None, rng.randint(0, 3000)])
                answers = [await ledger.arrive(entry, capacity=capacity, max_queue=12, max_ahead=max_ahead) for ledger in (memory, shared)]
                assert answers[0] == answers[1], f"step {seq}: arrive"
                woken = answers[0].woken
                if answers[0].outcome == "granted":
                    running.append(entry.id)
                elif answers[0].outcome == "queued":
                    waiting.append(entry.id)
            elif roll < 0.75 and running:
                gone = running.pop(rng.randrange(len(running)))
                answers = [await ledger.release(gone, capacity) for ledger in (memory, shared)]
                assert answers[0] == answers[1], f"step {seq}: release"
                woken = answers[0]
            elif roll < 0.85 and waiting:
                gone = waiting.pop(rng.randrange(len(waiting)))
                answers = [await ledger.withdraw(gone, capacity) for ledger in (memory, shared)]
                assert answers[0] == answers[1], f"step {seq}: withdraw"
                woken = answers[0]
            else:
                answers = [await ledger.dispatch(capacity) for ledger in (memory, shared)]
                assert answers[0] == answers[1], f"step {seq}: dispatch"
                woken = answers[0]
            for granted in woken:
                waiting.remove(granted)
                running.append(granted)
            if rng.random() < 0.1:
                clock.advance(rng.uniform(0.0, 7.0))
            assert await memory.waiting() == await shared.waiting() == len(waiting)
    finally:
        await client.close()
