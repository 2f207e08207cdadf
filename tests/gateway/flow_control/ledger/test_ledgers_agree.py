"""The in-process ledger and the Redis ledger are one algorithm: a long random script of
arrivals, releases, withdrawals, dispatches and clock moves, with bands, aging, weights, costs,
SLO bounds and the top band's headroom, gets the same answer from both at every step — grants
into headroom included, and requests aged into the top band kept out of it."""

from __future__ import annotations

import random

import pytest

from gateway.flow_control.ledger.base import Entry, top_slots
from gateway.flow_control.ledger.fair_order import entry_id
from gateway.flow_control.ledger.memory_ledger import MemoryLedger
from gateway.flow_control.ledger.redis_ledger import RedisLedger
from gateway.keys.resp import RespClient
from tests.gateway.keys.conftest import FakeClock
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.anyio

STEPS = 1200
CHANGE = 0.2  # how often the backend's room changes between steps (as replicas come, go and fill)
MOVE_S = 4.0  # the clock moves up to this 1 step in 10: slow enough beside aging_s (5 s) that the
# lower bands still wait when a top-band request arrives, so it is granted past them


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_both_ledgers_answer_every_step_alike(redis: RedisServer, clock: FakeClock, seed: int) -> None:
    rng = random.Random(seed)
    memory = MemoryLedger(3, 5.0, clock=clock, owner="w1")
    client = RespClient(redis.url, timeout_s=5.0)
    shared = RedisLedger(client, "agree", num_bands=3, aging_s=5.0, owner="w1", lease_s=3600.0, expiry_s=3600.0, clock=clock)
    running: list[str] = []
    waiting: list[str] = []
    sent: dict[str, int] = {}  # id -> the band it was sent in
    seen = {"into headroom": 0, "top band at once past a queue": 0, "lower band past the capacity": 0,
            "aged into the top band, kept out of a free headroom": 0, "into headroom while an aged one waits": 0}
    capacity, top = 2, 3
    try:
        for seq in range(STEPS):
            if rng.random() < CHANGE:
                capacity = rng.randint(1, 4)
                top = rng.choice([None, capacity + rng.randint(0, 3), rng.randint(0, 4)])  # None: no headroom; below capacity: none
            roll = rng.random()
            at_once = False  # granted at once into headroom
            if roll < 0.45:
                entry = Entry(entry_id(seq, "w1"), rng.choice("ABCD"), rng.randint(0, 2), rng.randint(1, 500), rng.choice([0.5, 1.0, 2.5]))
                sent[entry.id] = entry.band
                max_ahead = rng.choice([None, rng.randint(0, 3000)])
                answers = [await ledger.arrive(entry, capacity=capacity, max_queue=12, max_ahead=max_ahead, top_capacity=top)
                           for ledger in (memory, shared)]
                assert answers[0] == answers[1], f"step {seq}: arrive"
                woken, at_once = answers[0].woken, answers[0].into_headroom
                seen["into headroom"] += at_once
                if answers[0].outcome == "granted":
                    others_waiting = len(waiting) > len(woken)
                    seen["top band at once past a queue"] += entry.band == 0 and others_waiting
                    seen["lower band past the capacity"] += entry.band > 0 and len(running) + len(woken) >= capacity
                    running.append(entry.id)
                elif answers[0].outcome == "queued":
                    waiting.append(entry.id)
            elif roll < 0.75 and running:
                gone = running.pop(rng.randrange(len(running)))
                answers = [await ledger.release(gone, capacity, top) for ledger in (memory, shared)]
                assert answers[0] == answers[1], f"step {seq}: release"
                woken = answers[0]
            elif roll < 0.85 and waiting:
                gone = waiting.pop(rng.randrange(len(waiting)))
                answers = [await ledger.withdraw(gone, capacity, top) for ledger in (memory, shared)]
                assert answers[0] == answers[1], f"step {seq}: withdraw"
                woken = answers[0]
            else:
                answers = [await ledger.dispatch(capacity, top) for ledger in (memory, shared)]
                assert answers[0] == answers[1], f"step {seq}: dispatch"
                woken = answers[0]
            for granted, headroom in woken:
                waiting.remove(granted)
                running.append(granted)
                seen["into headroom"] += headroom
            aged = any(sent[each] > 0 and memory.band_of(each) == 0 for each in waiting)  # in band 0, not sent there
            slots = top_slots(capacity, capacity if top is None else top)
            seen["aged into the top band, kept out of a free headroom"] += aged and len(running) < slots
            seen["into headroom while an aged one waits"] += aged and (at_once or any(headroom for _, headroom in woken))
            if rng.random() < 0.1:
                clock.advance(rng.uniform(0.0, MOVE_S))
            assert await memory.waiting() == await shared.waiting() == len(waiting)
        assert all(seen.values()), seen  # the script reached the headroom's every rule, not only the ordinary slots
    finally:
        await client.close()
