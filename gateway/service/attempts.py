"""The service machinery every wire API shares: one client request across its attempts
(`Observed`: targets, fallback, hooks, in-flight counts, metrics, breakers, the request log),
waiting for a backend's first events before any byte goes out (`open_events`), a streamed body
that ends the request exactly once whatever happens (`stream_body`), and running a request to
its end for a non-streaming answer (`collect_events`).

A front-end (chat completions, Responses, ...) brings only its wire shape: a `StreamWriter`
that turns event batches into bytes, or an `EventSink` that assembles the response object.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import msgspec

from gateway.errors import error_payload
from gateway.flow_control import Asked, Ticket
from gateway.observability.metrics import ArmMetrics
from gateway.observability.request_log import Attempt
from gateway.service.accounting import RequestAccounting
from gateway.service.admission import BackendLimiter, Deadline
from gateway.service.gateway import EventPump, Gateway, Resolved
from gateway.service.outcomes import check_usage, error_label, outcome_of, retry_kind
from gateway.service.request_timer import RequestTimer, is_token_event
from gateway.service.route_plan import RoutePlan
from gateway.service.shadow import fork_shadow
from gateway.service.stream_feed import BODY_WRITER, StreamFeed, StreamWriter
from plugins.contract.capabilities import check_capabilities
from plugins.contract.config_types import Target
from plugins.contract.errors import ContextLengthExceeded, SwitchyardError, UpstreamError
from plugins.contract.protocol import Capabilities, Event, RequestSpec, Usage


@dataclass
class Answer:
    """What the app sends: the body (an SSE byte iterator, or the response object) and the
    backend that served it (`x-switchyard-backend`)."""

    body: Any
    backend: str


class FittedMaxTokens:
    """The output limit a request's attempt was served with after its route fitted it into the
    context left (`RouteLimits.fit`); None while it was not."""

    __slots__ = ("served",)

    def __init__(self) -> None:
        self.served: int | None = None


# Where `Observed` notes a fitted output limit, for the response headers: set by
# `gateway.http.common.answer_client` around serving a request on a route that clamps (the
# front-ends in between pass only the request and its answer).
FITTED_MAX_TOKENS: ContextVar[FittedMaxTokens | None] = ContextVar("switchyard_fitted_max_tokens", default=None)


@dataclass
class Observed:
    """One client request across its attempts: picking targets (fallback), the hooks, the
    in-flight counts, and — once, at the end — metrics, breaker and request log."""

    gateway: Gateway
    spec: RequestSpec  # as the client sent it; each attempt gets a copy with its upstream model
    plan: RoutePlan
    timer: RequestTimer = field(default_factory=RequestTimer)
    resolved: Resolved | None = None
    attempt_spec: RequestSpec | None = None
    served_by: str | None = None  # the replica the current attempt went to, as its backend said
    usage: Usage | None = None
    tried: list[Target] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    last_error: BaseException | None = None
    deadline: Deadline | None = None  # the route's `request_timeout_s`, from the request's start
    slot: BackendLimiter | Ticket | None = None  # the backend slot the current attempt holds
    queued_ms: int | None = None  # waited in flow-control queues, over its attempts (None: never)
    on_pump: Callable[[EventPump], None] | None = None  # told each attempt's pump (to interrupt it: cancel)
    accounting: RequestAccounting | None = None  # the key's reservation and the trace, when on
    _arm: ArmMetrics | None = field(default=None, init=False)  # the metrics of the current attempt's arm

    def __post_init__(self) -> None:
        self.deadline = Deadline.after(self.plan.limits.request_timeout_s)

    def next_attempt(self) -> Resolved | None:
        """Pick the next target and start an attempt on it (hook, in-flight counts). None when
        the route has no target left to try; then `last_error` is the answer."""
        gateway, plan = self.gateway, self.plan
        while len(self.tried) < plan.max_attempts:
            resolved = gateway.pick(self.spec, plan, self.tried)
            if resolved is None:
                return None
            caps = resolved.backend.capabilities()
            asked = self.accounting.asked if self.accounting is not None else None
            spec = self._attempt_spec(resolved.target.model, caps, asked)
            self.tried.append(resolved.target)
            try:
                check_capabilities(spec, caps, resolved.backend.name)
            except SwitchyardError:
                if len(self.tried) == 1:
                    raise  # the route's first choice cannot do it: the client's 400
                gateway.metrics.attempts.labels(plan.route.name, resolved.target.backend, "unsupported").inc()
                self.attempts.append(Attempt(backend=resolved.target.backend, outcome="unsupported"))
                continue
            if (on_request := gateway.pm.hook.switchyard_on_request).get_hookimpls():  # pluggy's call costs ~5 µs
                on_request(spec=spec, backend=resolved.backend)
            if self.accounting is not None:
                spec = self.accounting.on_attempt(resolved, spec)
            if len(self.tried) == 1:
                fork_shadow(gateway, self.spec, plan, asked.ask if asked is not None else None)  # once per request, once servable
            self.resolved, self.attempt_spec, self.served_by = resolved, spec, None
            backend = resolved.backend.name
            self._arm = gateway.metrics.arm(plan.route.name, backend)
            gateway.in_flight[backend] = gateway.in_flight.get(backend, 0) + 1
            self.arm.in_flight.inc()  # type: ignore[union-attr]
            return resolved
        return None

    def _attempt_spec(self, model: str, caps: Capabilities, asked: Asked | None) -> RequestSpec:
        """The client's spec for one attempt: its upstream model; with flow control, the band's
        `priority` for the engine — and `priority` is the gateway's own field then, never refused:
        a backend that does not take it is not sent it (it leaves `extensions`)."""
        if asked is None:
            return msgspec.structs.replace(self.spec, upstream_model=model)
        extensions = self.spec.extensions
        if "priority" in extensions and "priority" not in caps.extensions:
            extensions = extensions - {"priority"}
        return msgspec.structs.replace(self.spec, upstream_model=model, priority=asked.priority, extensions=extensions)

    @property
    def arm(self) -> ArmMetrics:
        assert self._arm is not None
        return self._arm

    async def admit(self) -> None:
        """Wait for a slot on the attempt's backend: its flow-control queue (`[server.flow_control]`:
        in fair order while the backend is full; 429 when it sheds), else its `max_concurrent`
        (429 when its queue is full)."""
        backend = self.resolved.backend.name  # type: ignore[union-attr]
        flow, asked = self.gateway.flow, self.accounting.asked if self.accounting is not None else None
        queue = flow.queue_of(backend) if flow is not None else None
        if queue is not None and asked is not None:
            ticket = await queue.admit(asked.ask, self.deadline)
            self.slot = ticket
            if ticket.queued_ms is not None:
                self.queued_ms = (self.queued_ms or 0) + ticket.queued_ms
            return
        limiter = self.gateway.limiters.get(backend)
        if limiter is not None:
            await limiter.acquire(self.deadline)
            self.slot = limiter

    def start_pump(self) -> EventPump:
        """The attempt's backend generation, in a pump the drain and the deadline can end."""
        pump = EventPump(self.resolved.backend.generate(self.attempt_spec))  # type: ignore[union-attr,arg-type]
        if self.deadline is not None:
            pump.interrupt_at(self.deadline.at, self.deadline.error())
        self.gateway.track(pump)
        if self.on_pump is not None:
            self.on_pump(pump)
        return pump

    async def first_events(self) -> tuple[EventPump, list[Event] | None]:
        """Start the attempt's pump and wait for its first events (None: it ended without any).
        On a route that clamps the output (`over_max_tokens = "clamp"`), an attempt whose backend
        says the output does not fit the context left is started once more, on the same target,
        with the output limit that fits (`RouteLimits.fit`). The pump is closed if this raises."""
        pump = self.start_pump()
        try:
            return pump, await pump.next_batch()
        except ContextLengthExceeded as exc:
            await self.close_pump(pump)
            fitted = self.plan.limits.fit(exc, self.attempt_spec.sampling.max_tokens)  # type: ignore[union-attr]
            if fitted is None:
                raise
        except BaseException:
            await self.close_pump(pump)
            raise
        self._fit_max_tokens(fitted)
        pump = self.start_pump()
        try:
            return pump, await pump.next_batch()
        except BaseException:
            await self.close_pump(pump)
            raise

    def _fit_max_tokens(self, max_tokens: int) -> None:
        spec = self.attempt_spec
        assert spec is not None and self.resolved is not None
        self.attempt_spec = msgspec.structs.replace(spec, sampling=msgspec.structs.replace(spec.sampling, max_tokens=max_tokens))
        self.gateway.metrics.attempts.labels(self.plan.route.name, self.resolved.backend.name, "max_tokens_fitted").inc()
        note = FITTED_MAX_TOKENS.get()
        if note is not None:
            note.served = max_tokens

    async def close_pump(self, pump: EventPump) -> None:
        self.gateway.untrack(pump)
        self.served_by = pump.served_by
        if pump.exhausted:  # ran to its end: nothing is left to abort, closing it does not wait
            await pump.close()
            return
        with anyio.CancelScope(shield=True):
            await pump.close()

    def _leave(self) -> None:
        backend = self.resolved.backend.name  # type: ignore[union-attr]
        self.gateway.in_flight[backend] -= 1
        self.arm.in_flight.dec()  # type: ignore[union-attr]
        if self.slot is not None:
            self.slot.release()
            self.slot = None

    def may_retry(self, error: BaseException) -> bool:
        """After a failure before the first token: whether another target may be tried (the
        attempt is then closed and counted)."""
        if retry_kind(error) is None or len(self.tried) >= min(self.plan.max_attempts, len(self.plan.route.targets)):
            return False
        assert self.resolved is not None
        self._leave()
        if self.accounting is not None:
            self.accounting.on_attempt_failed(error, self.served_by)
        outcome = self.gateway.record_failed_attempt(self.plan, self.resolved.target, error)
        self.attempts.append(Attempt(backend=self.resolved.backend.name, outcome=outcome))
        self.last_error = error
        return True

    def committed(self) -> None:
        """The attempt produced its first events: it serves the request, whatever follows."""
        assert self.resolved is not None
        self.arm.attempts_ok.inc()  # type: ignore[union-attr]
        self.attempts.append(Attempt(backend=self.resolved.backend.name, outcome="ok"))

    def end(self, error: BaseException | None, *, first_token: bool = True) -> None:
        """The request is over: served, failed or cancelled. `first_token` False: its last
        attempt failed before any event and is counted here."""
        resolved = self.resolved
        assert resolved is not None and self.attempt_spec is not None
        self._leave()
        if not first_token and error is not None:
            kind = "cancelled" if outcome_of(error) == "cancelled" else (retry_kind(error) or error_label(error))
            self.gateway.metrics.attempts.labels(self.plan.route.name, resolved.backend.name, kind).inc()
            self.attempts.append(Attempt(backend=resolved.backend.name, outcome=kind))
        self._record(error)

    def give_up(self) -> BaseException:
        """No target is left after failed attempts (all tried, or the rest open or unable):
        the request fails with the last attempt's error, recorded against the last backend."""
        error = self.last_error or UpstreamError(
            f"No backend of `{self.plan.route.name}` could serve the request.", kind="unavailable"
        )
        if self.resolved is not None:
            self._record(error)
        return error

    def _record(self, error: BaseException | None) -> None:
        resolved, spec = self.resolved, self.attempt_spec
        assert resolved is not None and spec is not None
        outcome, timings = self.gateway.record(
            plan=self.plan,
            target=resolved.target,
            spec=spec,
            arm=self.arm,
            timer=self.timer,
            usage=self.usage,
            error=error,
            attempts=self.attempts,
            replica=self.served_by,
            queued_ms=self.queued_ms,
        )
        if (on_response := self.gateway.pm.hook.switchyard_on_response).get_hookimpls():
            on_response(spec=spec, backend=resolved.backend, usage=self.usage, outcome=outcome, timings=timings)
        if self.accounting is not None:
            self.accounting.finish(error, usage=self.usage, resolved=resolved, spec=spec, replica=self.served_by,
                                   timings=timings)



class EventSink(Protocol):
    """A wire API's non-streamed answer being assembled from events."""

    def feed(self, event: Event) -> None: ...

    def check_complete(self, backend: str) -> None:
        """Raise `SwitchyardError` if the backend ended without finishing."""


@dataclass
class Opened:
    """A request whose first events arrived: nothing has gone to the client yet."""

    observed: Observed
    pump: EventPump
    first: list[Event]

    @property
    def backend(self) -> str:
        return self.observed.resolved.backend.name  # type: ignore[union-attr]


async def open_events(gateway: Gateway, spec: RequestSpec, on_pump: Callable[[EventPump], None] | None = None,
                      accounting: RequestAccounting | None = None) -> Opened:
    """Start a backend and wait for its first events, so that a failure before any token
    (context too long, upstream down) is still answered with a real HTTP status — and, on a
    route that allows more attempts, tried on the next target instead. Nothing has gone to
    the client before this returns; after it, nothing is retried. `accounting`: the request's
    key reservation and trace (`gateway.service.accounting.open_accounting`), told of every step."""
    plan = gateway.plan(spec.model)
    observed = Observed(gateway, spec, plan, on_pump=on_pump, accounting=accounting)
    while True:
        resolved = observed.next_attempt()
        if resolved is None:
            raise observed.give_up()
        pump: EventPump | None = None
        try:
            await observed.admit()
            pump, first = await observed.first_events()
        except BaseException as exc:
            if pump is not None:
                await observed.close_pump(pump)
            if observed.may_retry(exc):
                continue
            observed.end(exc, first_token=False)
            raise
        observed.committed()
        return Opened(observed, pump, first or [])


class LastPiece(bytes):
    """The last piece of a streamed body: the server sends it together with the end of the
    response (one write instead of two)."""

    __slots__ = ()


async def stream_body(opened: Opened, writer: StreamWriter) -> AsyncIterator[bytes]:
    """The streamed body of an opened request through `writer`; the backend is closed and the
    request recorded exactly once, however the stream ends (completed, failed, client gone).
    A stream that ends by itself is recorded before its end goes out, as a `LastPiece`, which
    also carries the bytes of the stream's last batch when the pump knew it was the last (one
    client write less). Sent by `gateway.http.common.send_sse` from our own server's request cycle
    (`BODY_WRITER`), a proxied stream's middle batches are written to the client as they
    arrive, without this generator (`StreamFeed.push`, `push_text`): whatever passes its
    pieces on between here and `send_sse` must pass them on unchanged."""
    observed, pump = opened.observed, opened.pump
    body = StreamFeed(observed.timer, observed.accounting, writer, BODY_WRITER.get())
    error: BaseException | None = None
    held = b""  # the last batch's bytes, sent with the end
    try:
        out = writer.start(opened.first)
        batch: list[Event] | None = opened.first
        while batch is not None:
            out += body.feed(batch)
            if pump.exhausted:
                held = out
                break
            if out:
                yield out
            out = b""
            batch = await pump.next_batch(body.sink)
        observed.usage = check_usage(body.usage, opened.backend)
        last = held + await writer.finish(observed.usage)
    except SwitchyardError as exc:
        error = exc
        payload = error_payload(exc, observed.gateway.redact)[1]
        observed.gateway.metrics.errors.labels(payload.error.type).inc()
        last = held + body.kept + await writer.error(exc, payload)
    except BaseException as exc:
        error = exc
        raise
    finally:
        await observed.close_pump(pump)
        observed.end(error)
    yield LastPiece(last)


async def collect_events(gateway: Gateway, spec: RequestSpec, new_sink: Callable[[], Any],
                         on_pump: Callable[[EventPump], None] | None = None,
                         accounting: RequestAccounting | None = None) -> tuple[Any, Usage, str]:
    """Run the request to its end into a fresh `new_sink()` per attempt. A failure before the
    backend's first event is tried on the next target when the route allows more attempts.
    Returns the sink, the usage and the backend that served."""
    plan = gateway.plan(spec.model)
    observed = Observed(gateway, spec, plan, on_pump=on_pump, accounting=accounting)
    while True:
        resolved = observed.next_attempt()
        if resolved is None:
            raise observed.give_up()
        backend = resolved.backend.name
        sink: EventSink = new_sink()
        pump: EventPump | None = None
        error: BaseException | None = None
        started = False
        try:
            await observed.admit()
            pump, batch = await observed.first_events()
            while batch is not None:
                if not started:
                    started = True
                    observed.committed()
                if any(is_token_event(e) for e in batch):
                    observed.timer.mark_tokens()
                if observed.accounting is not None:
                    observed.accounting.on_events(batch)
                for event in batch:
                    if isinstance(event, Usage):
                        observed.usage = event
                    sink.feed(event)
                batch = await pump.next_batch()
            observed.usage = check_usage(observed.usage, backend)
            sink.check_complete(backend)
        except BaseException as exc:
            error = exc
        finally:
            if pump is not None:
                await observed.close_pump(pump)
        if error is None:
            observed.end(None)
            return sink, observed.usage, backend  # type: ignore[return-value]
        if not started and observed.may_retry(error):
            continue
        observed.end(error, first_token=started)
        raise error
