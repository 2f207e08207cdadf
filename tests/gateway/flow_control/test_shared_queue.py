"""`FlowQueue` on the Redis ledger: two worker processes share one fair order, a waiter
cancelled at any await leaves nothing behind in Redis, and an unreachable Redis follows
`on_state_error`."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.errors import StateUnavailable
from gateway.flow_control.ledger.redis_ledger import RedisLedger
from gateway.flow_control.queue import Ask, FlowQueue, QueueLimits
from gateway.keys.resp import RespClient
from tests.gateway.flow_control.queue_worker import ledger_for
from tests.support.redis_server import RedisServer
from tests.support.server import free_port

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[3]
PROCESS_WAIT_S = 60.0


async def wait_for(condition_coro, what: str) -> None:  # type: ignore[no-untyped-def]
    """Poll another process's progress through Redis (bounded; no assertion on the time)."""
    deadline = time.monotonic() + PROCESS_WAIT_S
    while not await condition_coro():
        assert time.monotonic() < deadline, f"{what} did not happen within {PROCESS_WAIT_S} s"
        await asyncio.sleep(0.02)


def start_worker(redis: RedisServer, owner: str, tenant: str, count: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "tests.gateway.flow_control.queue_worker", redis.url, owner, tenant, str(count)],
                            cwd=ROOT, stderr=subprocess.PIPE)


async def test_two_worker_processes_share_one_fair_order(redis: RedisServer) -> None:
    client = RespClient(redis.url, timeout_s=5.0)
    queue = FlowQueue("fleet", ledger_for(client, "main"), lambda: 1, limits=QueueLimits(poll_interval_s=3600.0))
    workers: list[subprocess.Popen[bytes]] = []
    try:
        holding = await queue.admit(Ask("warmup", 1, 100))  # the backend's one slot: everything else waits
        workers.append(start_worker(redis, "p1", "flood", 8))
        await wait_for(lambda: _waiting(queue, 8), "the flood queueing in worker 1")
        workers.append(start_worker(redis, "p2", "quiet", 2))
        await wait_for(lambda: _waiting(queue, 10), "the quiet tenant queueing in worker 2")
        holding.release()
        for worker in workers:
            _, stderr = await asyncio.to_thread(worker.communicate, timeout=PROCESS_WAIT_S)
            assert worker.returncode == 0, stderr.decode()
        order = [t.decode() for t in await client.call("LRANGE", "order", 0, -1)]
        assert len(order) == 10
        assert [i for i, t in enumerate(order) if t == "quiet"] == [1, 3]  # not behind the other worker's flood
        assert await queue.ledger.waiting() == 0
        assert await client.call("ZCARD", "switchyard:flow:{fleet}:running") == 0
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        await queue.close()
        await client.close()


async def _waiting(queue: FlowQueue, count: int) -> bool:
    return await queue.ledger.waiting() == count


async def test_a_waiter_cancelled_at_any_await_leaves_nothing_in_redis(redis: RedisServer) -> None:
    client = RespClient(redis.url, timeout_s=5.0)
    ledger = RedisLedger(client, "b", num_bands=3, aging_s=None, owner="w1", lease_s=600.0, expiry_s=600.0)
    slots = 1
    queue = FlowQueue("b", ledger, lambda: slots, limits=QueueLimits(poll_interval_s=0.001))
    try:
        for turns in range(12):
            holding = await queue.admit(Ask("warmup", 1, 100))
            waiter = asyncio.get_running_loop().create_task(queue.admit(Ask("a", 1, 100)))
            for turn in range(turns):
                await asyncio.sleep(0)
                if turn == 4:
                    holding.release()  # a grant on its way while the waiter goes
            waiter.cancel()
            try:
                (await waiter).release()
            except asyncio.CancelledError:
                pass
            holding.release()
            await queue.close()  # every clean-up step done
            assert await client.call("ZCARD", "switchyard:flow:{b}:running") == 0, f"a slot leaked after {turns} turns"
            assert await ledger.waiting() == 0, f"an entry stayed after {turns} turns"
    finally:
        await queue.close()
        await client.close()


@pytest.mark.parametrize("on_state_error", ["allow", "deny"])
async def test_an_unreachable_ledger_follows_on_state_error(on_state_error: str) -> None:
    client = RespClient(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.5)  # nothing listens there
    ledger = RedisLedger(client, "b", num_bands=3, aging_s=None, owner="w1", lease_s=600.0, expiry_s=600.0)
    queue = FlowQueue("b", ledger, lambda: 1, on_state_error=on_state_error)  # type: ignore[arg-type]
    try:
        if on_state_error == "deny":
            with pytest.raises(StateUnavailable):
                await queue.admit(Ask("a", 1, 100))
            return
        for _ in range(2):  # the second comes within the retry pause: not even asked
            ticket = await queue.admit(Ask("a", 1, 100))
            assert (ticket.tracked, ticket.queued_s) == (False, None)
            ticket.release()
    finally:
        await queue.close()
        await client.close()
