"""Helpers that drive a `FlowQueue` deterministically: a backend whose capacity the test sets,
waiters that record the order they were served in, and `until`, which lets the event loop run
(without sleeping) until a condition holds."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.flow_control.queue import Ask, FlowQueue, Ticket

LOOP_STEPS = 200


async def until(condition: Callable[[], bool], what: str = "the condition") -> None:
    """Yield to the event loop until `condition()` holds (a bounded number of turns, no clock)."""
    for _ in range(LOOP_STEPS):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{what} did not come about within {LOOP_STEPS} loop turns")


@dataclass
class Backend:
    """The two readings a backend gives its queue, set by the test."""

    slots: int = 1
    room: bool = True

    def capacity(self) -> int:
        return self.slots

    def has_room(self) -> bool:
        return self.room


@dataclass
class Served:
    """Waiters that record, in order, the tenant of each request given a slot."""

    queue: FlowQueue
    order: list[str] = field(default_factory=list)
    tickets: list[Ticket] = field(default_factory=list)
    tasks: list[asyncio.Task[Ticket]] = field(default_factory=list)

    def wait_for(self, ask: Ask) -> asyncio.Task[Ticket]:
        async def one() -> Ticket:
            ticket = await self.queue.admit(ask)
            self.order.append(ask.tenant)
            self.tickets.append(ticket)
            return ticket

        task = asyncio.get_running_loop().create_task(one())
        self.tasks.append(task)
        return task

    async def serve_in_turn(self, holding: Ticket, count: int) -> list[str]:
        """Release `holding`, then each ticket as it is granted, until `count` were served."""
        start = len(self.order)
        for served in range(start + 1, start + count + 1):
            holding.release()
            await until(lambda: len(self.order) >= served, f"grant #{served}")
            holding = self.tickets[-1]
        holding.release()
        return self.order[start:]
