"""`FlowQueue`: the queue in front of one backend, which opens only when the backend is full.

    ticket = await queue.admit(Ask(tenant, band, cost, weight, slo_s), deadline)   # QueueShed: 429
    try:
        ...run the request...
    finally:
        ticket.release()                 # once; a second call does nothing

or `async with queue.slot(ask, deadline) as ticket: ...`. `ticket.queued_s` is None when the
request went straight through, else how long it waited (the request log's `queued_ms`).

The backend supplies two readings, taken at each step: `capacity()`, how many requests it can
run at once (its routable replicas' slots), and `has_room()`, whether its engines still take
more (some replica below its concurrency and not reporting a queue of its own). The ledger
grants while fewer than `capacity()` run — counting the grants not yet placed on a replica, and
with a shared ledger every worker's — and `has_room()` holds.

A request that finds room and nobody waiting is granted in one ledger step: in this process, a
few dictionary operations. Otherwise it waits in fair order until a slot frees
(`ticket.release()` serves the next at once), capacity grows (`poke()`, or the next poll), its
wait passes `queue_timeout_s` (429) or its deadline (504), or its client goes away.

On the in-process ledger every step runs inline, in the caller's turn of the event loop; on a
shared ledger a step that nobody awaits (a release, a poke) runs in a task of its own.

Cancellation is safe at every await: a waiter that leaves — cancelled, timed out, failed by the
drain — withdraws its entry in a clean-up step that runs to its end even if the waiter is
cancelled again; an entry granted just as its waiter left is released, never leaked.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal, Protocol

import msgspec

from gateway.errors import RETRY_AFTER_S, QueueShed, StateUnavailable
from gateway.flow_control.ledger import Arrival, Entry, Ledger, LedgerError, MemoryLedger, entry_id
from gateway.flow_control.service_rate import ServiceRate, WaitPredictor
from gateway.flow_control.stats import FlowCounters, FlowObserver

log = logging.getLogger("switchyard.flow_control")

STATE_RETRY_S = 1.0  # after a ledger failure, it is left alone this long
CLOSE_DRAIN_S = 5.0


class Deadline(Protocol):
    """When the request must be over (`gateway.service.admission.Deadline`)."""

    at: float  # event-loop time

    def error(self) -> BaseException: ...


class Ask(msgspec.Struct, frozen=True):
    """What one request asks of the queue."""

    tenant: str
    band: int
    cost: int  # tokens: the prompt's estimate plus the output counted for it
    weight: float = 1.0  # its key's weight
    slo_s: float | None = None  # its route's `ttft_slo_ms`, in seconds


@dataclass(frozen=True, slots=True)
class QueueLimits:
    max_queue: int = 1024
    queue_timeout_s: float = 60.0
    poll_interval_s: float = 0.02


class Ticket:
    """A granted slot, held until `release()`."""

    __slots__ = ("queue", "entry", "granted_at", "queued_s", "tracked", "released")

    def __init__(self, queue: FlowQueue, entry: Entry, granted_at: float, queued_s: float | None, tracked: bool = True) -> None:
        self.queue = queue
        self.entry = entry
        self.granted_at = granted_at  # loop time
        self.queued_s = queued_s  # None: went straight through
        self.tracked = tracked  # False: admitted uncounted while the ledger was unreachable
        self.released = False

    @property
    def queued_ms(self) -> int | None:
        return None if self.queued_s is None else round(self.queued_s * 1000)

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        if self.tracked:
            self.queue._release(self)


class FlowQueue:
    def __init__(self, backend: str, ledger: Ledger, capacity: Callable[[], int], *, has_room: Callable[[], bool] | None = None,
                 limits: QueueLimits = QueueLimits(), rate: ServiceRate | None = None, observer: FlowObserver | None = None,
                 on_state_error: Literal["allow", "deny"] = "allow") -> None:
        self.backend = backend
        self.ledger = ledger
        self.capacity = capacity
        self.has_room = has_room
        self.limits = limits
        self.rate = rate or ServiceRate()
        self.predictor = WaitPredictor(self.rate)
        self.observer: FlowObserver = observer or FlowCounters()
        self.on_state_error = on_state_error
        self._local = ledger if isinstance(ledger, MemoryLedger) else None  # its steps run inline
        self.depth: Counter[tuple[str, int]] = Counter()  # this worker's waiting requests by (tenant, band)
        self._ids = itertools.count()
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # releases, withdrawals, pokes: steps nobody awaits
        self._poller: asyncio.Task[None] | None = None
        self._down_until = 0.0

    # -- admission --------------------------------------------------------------------------------

    async def admit(self, ask: Ask, deadline: Deadline | None = None) -> Ticket:
        """A slot for `ask`: at once when the backend has room and nobody waits, else after
        waiting its turn. Raises `QueueShed` (429), the deadline's error (504), or
        `StateUnavailable` (503, a shared ledger down and `on_state_error = "deny"`)."""
        loop = asyncio.get_running_loop()
        entry = Entry(entry_id(next(self._ids), self.ledger.owner), ask.tenant, ask.band, ask.cost, ask.weight)
        max_ahead = None if ask.slo_s is None else self.predictor.max_ahead(ask.slo_s, self.capacity())
        waiter: asyncio.Future[None] | None = None
        if self._local is not None:
            arrival = self._local.arrive_now(entry, self._open_slots, self.limits.max_queue, max_ahead)
        else:
            if loop.time() < self._down_until:
                return self._unaccounted(entry, ask, None)
            waiter = self._waiters[entry.id] = loop.create_future()  # before the step: a grant may come back first
            try:
                arrival = await self.ledger.arrive(entry, capacity=self._open_slots(), max_queue=self.limits.max_queue,
                                                   max_ahead=max_ahead)
            except LedgerError as exc:
                del self._waiters[entry.id]
                return self._unaccounted(entry, ask, exc)
            except BaseException:
                del self._waiters[entry.id]
                self._spawn(self.ledger.withdraw(entry.id, self._open_slots()))  # cancelled mid-step: it may have counted
                raise
        if arrival.woken:
            self._wake(arrival.woken)
        if arrival.outcome == "queued":
            if waiter is None:
                waiter = self._waiters[entry.id] = loop.create_future()
            return await self._wait(entry, ask, waiter, deadline)
        if waiter is not None:
            del self._waiters[entry.id]
        if arrival.outcome == "granted":
            self.observer.admitted(self.backend, ask.tenant, ask.band, None)
            return Ticket(self, entry, loop.time(), None)
        raise self._shed(ask, arrival, self.capacity())

    async def try_admit(self, ask: Ask) -> Ticket | None:
        """A slot at once, or None: the backend is full, someone waits, or a shared ledger is
        unreachable. Never waits and counts no shed (a shadow copy is skipped, not refused)."""
        loop = asyncio.get_running_loop()
        entry = Entry(entry_id(next(self._ids), self.ledger.owner), ask.tenant, ask.band, ask.cost, ask.weight)
        if self._local is not None:
            arrival = self._local.arrive_now(entry, self._open_slots, 0, None)
        else:
            if loop.time() < self._down_until:
                return None
            try:
                arrival = await self.ledger.arrive(entry, capacity=self._open_slots(), max_queue=0, max_ahead=None)
            except LedgerError:
                return None
            except BaseException:
                self._spawn(self.ledger.withdraw(entry.id, self._open_slots()))
                raise
        if arrival.woken:
            self._wake(arrival.woken)
        return Ticket(self, entry, loop.time(), None) if arrival.outcome == "granted" else None

    @asynccontextmanager
    async def slot(self, ask: Ask, deadline: Deadline | None = None) -> AsyncIterator[Ticket]:
        ticket = await self.admit(ask, deadline)
        try:
            yield ticket
        finally:
            ticket.release()

    async def _wait(self, entry: Entry, ask: Ask, waiter: asyncio.Future[None], deadline: Deadline | None) -> Ticket:
        loop = asyncio.get_running_loop()
        started = loop.time()
        until = started + self.limits.queue_timeout_s
        by_deadline = deadline is not None and deadline.at < until
        key = (ask.tenant, ask.band)
        self.depth[key] += 1
        self._may_poll()
        try:
            async with asyncio.timeout_at(deadline.at if by_deadline else until):  # type: ignore[union-attr]
                await waiter
        except BaseException as exc:
            await self._leave(entry)
            if isinstance(exc, TimeoutError):
                if by_deadline:
                    self.observer.shed(self.backend, ask.tenant, ask.band, "deadline")
                    raise deadline.error() from None  # type: ignore[union-attr]
                self.observer.shed(self.backend, ask.tenant, ask.band, "timeout")
                raise QueueShed(
                    f"Backend `{self.backend}` had no free slot within {self.limits.queue_timeout_s:g} s; retry later.",
                    reason="timeout", retry_after_s=RETRY_AFTER_S,
                ) from None
            self.observer.shed(self.backend, ask.tenant, ask.band, "cancelled" if isinstance(exc, asyncio.CancelledError) else "shutdown")
            raise
        finally:
            del self._waiters[entry.id]
            self.depth[key] -= 1
            if not self.depth[key]:
                del self.depth[key]
        queued_s = loop.time() - started
        self.observer.admitted(self.backend, ask.tenant, ask.band, queued_s)
        return Ticket(self, entry, loop.time(), queued_s)

    async def _leave(self, entry: Entry) -> None:
        """Take a waiter that is going away out of the ledger: `withdraw` takes it out of the
        queue, or releases it if its grant came just as it left. On a shared ledger the step
        runs to its end whatever happens to the waiter meanwhile."""
        if self._local is not None:
            self._wake(self._local.withdraw_now(entry.id, self._open_slots))
            return
        await asyncio.shield(self._spawn(self.ledger.withdraw(entry.id, self._open_slots())))

    def _shed(self, ask: Ask, arrival: Arrival, capacity: int) -> QueueShed:
        retry_after = self.predictor.retry_after_s(arrival.ahead, capacity)
        self.observer.shed(self.backend, ask.tenant, ask.band, arrival.outcome)
        if arrival.outcome == "queue_full":
            return QueueShed(f"Backend `{self.backend}` is at capacity and its queue is full ({self.limits.max_queue} waiting); "
                             "retry later.", reason="queue_full", retry_after_s=retry_after)
        wait = self.predictor.wait_s(arrival.ahead, capacity) or 0.0
        return QueueShed(f"Backend `{self.backend}` is at capacity: this request would wait about {wait:.1f} s for a slot, "
                         f"longer than its time-to-first-token objective of {ask.slo_s:g} s; retry later.",
                         reason="slo", retry_after_s=retry_after)

    def _unaccounted(self, entry: Entry, ask: Ask, exc: LedgerError | None) -> Ticket:
        """The ledger is unreachable: admit uncounted (`on_state_error = "allow"`) or refuse (503)."""
        loop = asyncio.get_running_loop()
        if exc is not None:
            if self._down_until <= loop.time():
                log.warning("flow control: the ledger (%s) of backend %s failed: %s; following on_state_error=%s for %g s",
                            self.ledger.describe(), self.backend, exc, self.on_state_error, STATE_RETRY_S)
            self._down_until = loop.time() + STATE_RETRY_S
        if self.on_state_error == "deny":
            self.observer.shed(self.backend, ask.tenant, ask.band, "state_error")
            raise StateUnavailable("The queue of this backend cannot be reached right now; retry shortly.", code="state_unavailable")
        return Ticket(self, entry, loop.time(), None, tracked=False)

    # -- slots coming free --------------------------------------------------------------------------

    def _release(self, ticket: Ticket) -> None:
        self.rate.observe(ticket.entry.cost, asyncio.get_running_loop().time() - ticket.granted_at)
        if self._local is not None:
            woken = self._local.release_now(ticket.entry.id, self._open_slots)
            if woken:
                self._wake(woken)
        else:
            self._spawn(self.ledger.release(ticket.entry.id, self._open_slots()))

    def poke(self) -> None:
        """Capacity may have grown (a replica joined, an engine reported less load): serve the
        waiters it has room for now rather than at the next poll."""
        if self._local is not None:
            self._wake(self._local.dispatch_now(self._open_slots))
        elif self._waiters:
            self._spawn(self.ledger.dispatch(self._open_slots()))

    def fail_waiters(self, error: BaseException) -> None:
        """End every waiter with `error` (the server is draining)."""
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(error)

    @property
    def num_waiting(self) -> int:
        """This worker's waiting requests."""
        return sum(self.depth.values())

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=CLOSE_DRAIN_S)
        await self.ledger.close()

    # -- inside --------------------------------------------------------------------------------------

    def _open_slots(self) -> int:
        """The capacity the ledger grants against: none while the engines take no more."""
        if self.has_room is not None and not self.has_room():
            return 0
        return self.capacity()

    def _spawn(self, step: Awaitable[tuple[str, ...]]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._apply(step))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _apply(self, step: Awaitable[tuple[str, ...]]) -> None:
        try:
            woken = await step
        except LedgerError as exc:
            log.warning("flow control: a step of backend %s's ledger (%s) failed: %s; its entries expire on their own",
                        self.backend, self.ledger.describe(), exc)
            return
        self._wake(woken)

    def _wake(self, woken: tuple[str, ...]) -> None:
        """Hand granted slots to their waiters. A waiter already gone is in its clean-up step,
        which withdraws — and so releases — the entry: nothing to do here."""
        for granted in woken:
            waiter = self._waiters.get(granted)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _may_poll(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        """While this worker has waiters: re-read capacity and collect grants other workers
        made to them."""
        while self._waiters:
            await asyncio.sleep(self.limits.poll_interval_s)
            if self._local is not None:
                self._wake(self._local.dispatch_now(self._open_slots))
            elif self._waiters:
                await self._apply(self.ledger.dispatch(self._open_slots()))


def new_owner() -> str:
    """An owner id for this worker's ledger entries: unique among the gateways sharing a ledger."""
    return secrets.token_hex(4)
