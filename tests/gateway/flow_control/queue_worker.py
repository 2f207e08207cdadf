"""One gateway worker of the two-process test, run as its own Python process:

    python -m tests.gateway.flow_control.queue_worker REDIS_URL OWNER TENANT COUNT

It queues COUNT requests of TENANT on backend `fleet` (one slot, shared through Redis) with a
real `FlowQueue` and `RedisLedger`; each request, once granted, appends its tenant to the Redis
list `order` and releases its slot. It exits when all were served."""

from __future__ import annotations

import asyncio
import sys

from gateway.flow_control.ledger.redis_ledger import RedisLedger
from gateway.flow_control.queue import Ask, FlowQueue, QueueLimits
from gateway.keys.resp import RespClient

BACKEND = "fleet"
SLOTS = 1


def ledger_for(client: RespClient, owner: str) -> RedisLedger:
    return RedisLedger(client, BACKEND, num_bands=3, aging_s=None, owner=owner, lease_s=600.0, expiry_s=600.0)


async def serve(url: str, owner: str, tenant: str, count: int) -> None:
    client = RespClient(url, timeout_s=5.0)
    queue = FlowQueue(BACKEND, ledger_for(client, owner), lambda: SLOTS, limits=QueueLimits(poll_interval_s=0.005))

    async def one() -> None:
        ticket = await queue.admit(Ask(tenant, 1, 100))
        await client.call("RPUSH", "order", tenant)
        ticket.release()

    try:
        await asyncio.gather(*(one() for _ in range(count)))
    finally:
        await queue.close()
        await client.close()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
