"""Limits the gateway enforces itself: per-request caps (messages, max_tokens), the bounded
queue in front of each backend, the request deadline, and the errors of a draining server.

`BackendLimiter` is admission control for one backend: at most `max_concurrent` requests run
at once; up to `max_queue` more wait, first come first served, at most `queue_timeout_s`; any
other is refused at once with `Overloaded` (429 and `Retry-After`; the next target on a fallback
route). A released slot goes straight to the oldest waiter, so a burst cannot overtake the queue.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.errors import DeadlineExceeded
from plugins.contract.errors import InvalidRequest, Overloaded

if TYPE_CHECKING:
    from gateway.config import RouteConfig, ServerConfig

RETRY_AFTER_S = 1.0




@dataclass(frozen=True)
class Deadline:
    """When a request must be over, in event-loop time."""

    at: float
    timeout_s: float

    @classmethod
    def after(cls, timeout_s: float | None) -> Deadline | None:
        return None if timeout_s is None else cls(at=asyncio.get_running_loop().time() + timeout_s, timeout_s=timeout_s)

    def error(self) -> DeadlineExceeded:
        return DeadlineExceeded(self.timeout_s)


@dataclass(frozen=True)
class RouteLimits:
    """The limits in force on one route (the default: none)."""

    max_tokens: int | None = None
    request_timeout_s: float | None = None
    default_max_tokens: int | None = None  # what a request that asks for none gets (<= max_tokens)
    hosted_tools: str = "drop"  # Responses' hosted tools: "drop" or "reject" (`server.hosted_tools`)

    @classmethod
    def of(cls, server: ServerConfig, route: RouteConfig | None = None) -> RouteLimits:
        """`route`'s limits, the server's where it sets none (no route: a model served under its
        own name)."""
        if route is None:
            return cls(server.max_tokens, server.request_timeout_s, server.default_max_tokens, server.hosted_tools)
        return cls(route.max_tokens or server.max_tokens, route.request_timeout_s or server.request_timeout_s,
                   route.default_max_tokens or server.default_max_tokens, route.hosted_tools or server.hosted_tools)

    def max_tokens_for(self, model: str, param: str, asked: int | None,
                       endpoint_default: int | None = None) -> int | None:
        """The `max_tokens` a request for `model` gets (None: the rest of the context), the one
        place the route's cap and default apply. `asked`: what the client sent in `param` (None:
        nothing); more than the `max_tokens` cap is a 400 naming `param`. Asking for nothing gets
        `default_max_tokens` (else the cap), or `endpoint_default` (legacy completions' 16) where
        that is smaller or there is neither."""
        cap = self.max_tokens
        if asked is not None:
            if cap is not None and asked > cap:
                raise InvalidRequest(f"`{param}` is {asked}, more than model `{model}` allows ({cap}).", param=param)
            return asked
        fill = self.default_max_tokens or cap
        if fill is None:
            return endpoint_default
        return fill if endpoint_default is None else min(endpoint_default, fill)


def check_messages(count: int, max_messages: int) -> None:
    if count > max_messages:
        raise InvalidRequest(f"`messages` has {count} items, more than this server allows ({max_messages}).", param="messages")


class BackendLimiter:
    def __init__(self, backend: str, *, max_concurrent: int, max_queue: int = 0, queue_timeout_s: float = 30.0) -> None:
        self.backend = backend
        self.max_concurrent = max_concurrent
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    def can_admit_now(self) -> bool:
        return self.running < self.max_concurrent and not self.queued

    def try_acquire(self) -> bool:
        """A slot now, or False (never waits; for shadow copies)."""
        if not self.can_admit_now():
            return False
        self.running += 1
        return True

    async def acquire(self, deadline: Deadline | None = None) -> None:
        """Wait for a slot. `Overloaded` when the queue is full or no slot came within
        `queue_timeout_s`; `DeadlineExceeded` when the request's deadline came first."""
        if self.try_acquire():
            return
        if self.queued >= self.max_queue:
            raise Overloaded(
                f"Backend `{self.backend}` is at capacity ({self.running} requests running, {self.queued} queued); retry later.",
                retry_after_s=RETRY_AFTER_S,
            )
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        until = loop.time() + self.queue_timeout_s
        deadline_first = deadline is not None and deadline.at < until
        try:
            async with asyncio.timeout_at(deadline.at if deadline_first else until):  # type: ignore[union-attr]
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release()  # the slot came just as the wait ended: pass it on
            if not isinstance(exc, TimeoutError):
                raise
            if deadline_first:
                raise deadline.error() from None  # type: ignore[union-attr]
            raise Overloaded(
                f"Backend `{self.backend}` had no free slot within {self.queue_timeout_s:g} s; retry later.",
                retry_after_s=RETRY_AFTER_S,
            ) from None
        finally:
            try:
                self._waiters.remove(waiter)
            except ValueError:
                pass

    def release(self) -> None:
        """Free a slot: hand it to the oldest waiter, if any."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # `running` stays: the slot changes hands
                return
        self.running -= 1

    def fail_waiters(self, error: BaseException) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(error)
