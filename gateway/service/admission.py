"""Limits the gateway enforces itself: per-request caps (messages, max_tokens), the bounded
queue in front of each backend, the request deadline, and the errors of a draining server.

`BackendLimiter` is admission control for one backend: at most `max_concurrent` requests run
at once; up to `max_queue` more wait, first come first served, at most `queue_timeout_s`; any
other is refused at once with `Overloaded` (429 and `Retry-After`; the next target on a fallback
route). A released slot goes straight to the oldest waiter, so a burst cannot overtake the queue.
With `[server.flow_control]` on, `gateway.flow_control`'s queue takes its place: fair across
tenants, by priority band, and shedding by the route's `ttft_slo_ms`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gateway.errors import RETRY_AFTER_S, DeadlineExceeded
from plugins.contract.errors import ContextLengthExceeded, InvalidRequest, Overloaded

if TYPE_CHECKING:
    from gateway.config import RouteConfig, ServerConfig


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
    ttft_slo_ms: int | None = None  # flow control refuses a request predicted to wait longer for a slot
    # what an output limit over the cap (or the context) gets: a 400, or lowered to fit
    over_max_tokens: Literal["reject", "clamp"] = "reject"
    max_model_len: int | None = None  # the route's context, once its backends told it (the smallest)
    hosted_tools: str = "drop"  # Responses' hosted tools: "drop" or "reject" (`server.hosted_tools`)
    strip_billing_header: bool = True  # Claude Code's billing line out of system prompts (`server.strip_billing_header`)

    @classmethod
    def of(cls, server: ServerConfig, route: RouteConfig | None = None) -> RouteLimits:
        """`route`'s limits, the server's where it sets none (no route: a model served under its
        own name)."""
        slo_ms = server.flow_control.ttft_slo_ms
        if route is None:
            return cls(server.max_tokens, server.request_timeout_s, server.default_max_tokens, ttft_slo_ms=slo_ms,
                       over_max_tokens=server.over_max_tokens, hosted_tools=server.hosted_tools,
                       strip_billing_header=server.strip_billing_header)
        return cls(route.max_tokens or server.max_tokens, route.request_timeout_s or server.request_timeout_s,
                   route.default_max_tokens or server.default_max_tokens, ttft_slo_ms=route.ttft_slo_ms or slo_ms,
                   over_max_tokens=route.over_max_tokens or server.over_max_tokens,
                   hosted_tools=route.hosted_tools or server.hosted_tools,
                   strip_billing_header=server.strip_billing_header if route.strip_billing_header is None
                   else route.strip_billing_header)

    @property
    def clamps(self) -> bool:
        return self.over_max_tokens == "clamp"

    def max_tokens_for(self, model: str, param: str, asked: int | None,
                       endpoint_default: int | None = None) -> int | None:
        """The `max_tokens` a request for `model` gets (None: the rest of the context), the one
        place the route's cap and default apply. `asked`: what the client sent in `param` (None:
        nothing); more than the `max_tokens` cap is a 400 naming `param`, or on a route that
        clamps the cap (and at most the route's context, where known). Asking for nothing gets
        `default_max_tokens` (else the cap), or `endpoint_default` (legacy completions' 16) where
        that is smaller or there is neither."""
        cap = self.max_tokens
        if asked is not None:
            if cap is not None and asked > cap and not self.clamps:
                raise InvalidRequest(f"`{param}` is {asked}, more than model `{model}` allows ({cap}).", param=param)
            served: int | None = asked
        else:
            fill = self.default_max_tokens or cap
            served = endpoint_default if fill is None else (fill if endpoint_default is None else min(endpoint_default, fill))
        if not self.clamps or served is None:
            return served
        return min(n for n in (served, cap, self.max_model_len) if n is not None)

    def fit(self, error: ContextLengthExceeded, max_tokens: int | None) -> int | None:
        """On a route that clamps: the output limit that fits the context left after the prompt,
        as the backend's `error` told them (without the prompt's length: the whole context, for
        an output limit over it). None where the error stands: the route rejects, the backend
        told too little, the prompt alone fills the context, or the output limit was no part of it."""
        if not self.clamps or max_tokens is None or error.max_model_len is None:
            return None
        room = error.max_model_len - (error.prompt_tokens or 0)
        return room if 1 <= room < max_tokens else None


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
