"""Events → bytes: the streamed SSE body and the non-streaming response objects."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec

from gateway import schemas as S
from gateway.accounting import RequestAccounting
from gateway.errors import error_payload
from gateway.limits import BackendLimiter, Deadline
from gateway.metrics import ArmMetrics
from gateway.request_log import Attempt
from gateway.service import (
    EventPump,
    Gateway,
    RequestTimer,
    Resolved,
    RoutePlan,
    check_usage,
    error_label,
    is_token_event,
    outcome_of,
    retry_kind,
)
from gateway.sse import DONE, ChunkEncoder, chat_logprobs_json, error_event
from gateway.validation import check_capabilities
from plugins.errors import SwitchyardError, UpstreamError
from plugins.protocol import Event, Finish, RequestSpec, TextDelta, TokenLogprob, ToolCallDelta, Usage
from plugins.registry import Target


def response_id(spec: RequestSpec) -> str:
    prefix = "chatcmpl-" if spec.kind == "chat" else "cmpl-"
    return prefix + secrets.token_hex(12)


@dataclass
class Served:
    """What the app sends: the body (an SSE byte iterator, or the response object) and the
    backend that served it (`x-switchyard-backend`)."""

    body: Any
    backend: str


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
    usage: Usage | None = None
    tried: list[Target] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    last_error: BaseException | None = None
    deadline: Deadline | None = None  # the route's `request_timeout_s`, from the request's start
    slot: BackendLimiter | None = None  # the backend slot the current attempt holds
    accounting: RequestAccounting | None = None  # the key's reservation and the trace, when on

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
            spec = msgspec.structs.replace(self.spec, upstream_model=resolved.target.model)
            self.tried.append(resolved.target)
            try:
                check_capabilities(spec, resolved.backend.capabilities(), resolved.backend.name)
            except SwitchyardError:
                if len(self.tried) == 1:
                    raise  # the route's first choice cannot do it: the client's 400
                gateway.metrics.attempts.labels(plan.route.name, resolved.target.backend, "unsupported").inc()
                self.attempts.append(Attempt(backend=resolved.target.backend, outcome="unsupported"))
                continue
            gateway.pm.hook.switchyard_on_request(spec=spec, backend=resolved.backend)
            if self.accounting is not None:
                spec = self.accounting.on_attempt(resolved, spec)
            if len(self.tried) == 1:
                gateway.fork_shadow(self.spec, plan)  # once per request, once it is known to be servable
            self.resolved, self.attempt_spec = resolved, spec
            backend = resolved.backend.name
            gateway.in_flight[backend] = gateway.in_flight.get(backend, 0) + 1
            self.arm.in_flight.inc()  # type: ignore[union-attr]
            return resolved
        return None

    @property
    def arm(self) -> ArmMetrics:
        assert self.resolved is not None
        return self.gateway.metrics.arm(self.plan.route.name, self.resolved.backend.name)

    async def admit(self) -> None:
        """Wait for a slot on the attempt's backend when it has `max_concurrent` (429 when its
        queue is full)."""
        limiter = self.gateway.limiters.get(self.resolved.backend.name)  # type: ignore[union-attr]
        if limiter is not None:
            await limiter.acquire(self.deadline)
            self.slot = limiter

    def start_pump(self) -> EventPump:
        """The attempt's backend generation, in a pump the drain and the deadline can end."""
        pump = EventPump(self.resolved.backend.generate(self.attempt_spec))  # type: ignore[union-attr,arg-type]
        if self.deadline is not None:
            pump.interrupt_at(self.deadline.at, self.deadline.error())
        self.gateway.track(pump)
        return pump

    async def close_pump(self, pump: EventPump) -> None:
        self.gateway.untrack(pump)
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
            self.accounting.on_attempt_failed(error)
        outcome = self.gateway.record_failed_attempt(self.plan, self.resolved.target, error)
        self.attempts.append(Attempt(backend=self.resolved.backend.name, outcome=outcome))
        self.last_error = error
        return True

    def committed(self) -> None:
        """The attempt produced its first events: it serves the request, whatever follows."""
        assert self.resolved is not None
        self.gateway.metrics.attempts.labels(self.plan.route.name, self.resolved.backend.name, "ok").inc()
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
        )
        self.gateway.pm.hook.switchyard_on_response(
            spec=spec, backend=resolved.backend, usage=self.usage, outcome=outcome, timings=timings
        )
        if self.accounting is not None:
            self.accounting.finish(error, usage=self.usage, resolved=resolved, spec=spec, timings=timings)


# -- streaming ------------------------------------------------------------------------------------


async def open_stream(gateway: Gateway, spec: RequestSpec, accounting: RequestAccounting | None = None) -> Served:
    """Start a backend and wait for its first events, so that a failure before any token
    (context too long, upstream down) is still answered with a real HTTP status — and, on a
    route that allows more attempts, tried on the next target instead. Nothing has gone to
    the client before this returns; after it, nothing is retried. Returns the SSE body."""
    plan = gateway.plan(spec.model)
    observed = Observed(gateway, spec, plan, accounting=accounting)
    while True:
        resolved = observed.next_attempt()
        if resolved is None:
            raise observed.give_up()
        pump: EventPump | None = None
        try:
            await observed.admit()
            pump = observed.start_pump()
            first = await pump.next_batch()
        except BaseException as exc:
            if pump is not None:
                await observed.close_pump(pump)
            if observed.may_retry(exc):
                continue
            observed.end(exc, first_token=False)
            raise
        observed.committed()
        return Served(body=_sse_body(observed, pump, first), backend=resolved.backend.name)


async def _sse_body(observed: Observed, pump: EventPump, first: list[Event] | None) -> AsyncIterator[bytes]:
    spec = observed.spec
    backend = observed.resolved.backend.name  # type: ignore[union-attr]
    encoder = ChunkEncoder(
        id=response_id(spec),
        created=int(time.time()),
        model=spec.model,
        fingerprint=observed.gateway.config.server.system_fingerprint,
        chat=spec.kind == "chat",
        include_usage=spec.include_usage,
    )
    state = _StreamState(encoder, spec)
    error: BaseException | None = None
    try:
        out = state.start()
        batch = first
        while batch is not None:
            if any(is_token_event(e) for e in batch):
                observed.timer.mark_tokens()
            if observed.accounting is not None:
                observed.accounting.on_events(batch)
            out += state.feed(batch)
            if out:
                yield out
            out = b""
            batch = await pump.next_batch()
        observed.usage = check_usage(state.usage, backend)
        state.check_complete(backend)
        yield state.finish(observed.usage)
    except SwitchyardError as exc:
        error = exc
        payload = error_payload(exc, observed.gateway.redact)[1]
        observed.gateway.metrics.errors.labels(payload.error.type).inc()
        yield error_event(payload) + DONE
    except BaseException as exc:
        error = exc
        raise
    finally:
        await observed.close_pump(pump)
        observed.end(error)


class _StreamState:
    """Per-request stream state: which choices have started and finished, the usage."""

    def __init__(self, encoder: ChunkEncoder, spec: RequestSpec) -> None:
        self.encoder = encoder
        self.spec = spec
        self.n = spec.sampling.n
        self.finished: set[int] = set()
        self.usage: Usage | None = None
        # per choice: characters of token text sent so far (legacy completions' `text_offset`)
        self.text_offsets: dict[int, int] = {}

    def start(self) -> bytes:
        if not self.encoder.chat:
            return b""
        return b"".join(self.encoder.role(i) for i in range(self.n))

    def feed(self, batch: list[Event]) -> bytes:
        parts: list[bytes] = []
        last = len(batch) - 1
        skip_next = False
        for i, event in enumerate(batch):
            if skip_next:
                skip_next = False
                continue
            if isinstance(event, TextDelta):
                following = batch[i + 1] if i < last else None
                finish = None
                if isinstance(following, Finish) and following.index == event.index:
                    finish = following.reason
                    self._finish(following)
                    skip_next = True
                if event.text or event.logprobs or finish is not None:
                    parts.append(self.encoder.text(event.index, event.text, self._logprobs(event.logprobs, event.index), finish))
            elif isinstance(event, Finish):
                self._finish(event)
                parts.append(self.encoder.text(event.index, "", finish=event.reason))
            elif isinstance(event, ToolCallDelta):
                parts.append(self.encoder.tool_call(event))
            elif isinstance(event, Usage):
                self.usage = event
        return b"".join(parts)

    def _finish(self, event: Finish) -> None:
        if event.index in self.finished:
            raise UpstreamError(f"The backend finished choice {event.index} twice.", kind="bad_gateway")
        self.finished.add(event.index)

    def _logprobs(self, logprobs: list[TokenLogprob] | None, index: int) -> bytes:
        if logprobs is None:
            return b"null"
        if self.encoder.chat:
            return chat_logprobs_json(logprobs)
        offset = self.text_offsets.get(index, 0)
        self.text_offsets[index] = offset + sum(len(lp.token) for lp in logprobs)
        return _encode_completion_logprobs(logprobs, offset)

    def check_complete(self, backend: str) -> None:
        missing = set(range(self.n)) - self.finished
        if missing:
            raise UpstreamError(f"Backend `{backend}` ended without finishing choice {min(missing)}.", kind="bad_gateway")

    def finish(self, usage: Usage) -> bytes:
        return (self.encoder.usage(usage) if self.spec.include_usage else b"") + DONE


def _encode_completion_logprobs(logprobs: list[TokenLogprob], offset: int) -> bytes:
    return msgspec.json.encode(completion_logprobs(logprobs, offset=offset))


# -- non-streaming --------------------------------------------------------------------------------


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    tool_calls: dict[int, dict] = field(default_factory=dict)
    finish_reason: str | None = None


async def collect(gateway: Gateway, spec: RequestSpec, accounting: RequestAccounting | None = None) -> Served:
    """Run the request to its end and build the response object. A failure before the
    backend's first event is tried on the next target when the route allows more attempts."""
    plan = gateway.plan(spec.model)
    observed = Observed(gateway, spec, plan, accounting=accounting)
    while True:
        resolved = observed.next_attempt()
        if resolved is None:
            raise observed.give_up()
        backend = resolved.backend.name
        choices = [_Choice() for _ in range(spec.sampling.n)]
        pump: EventPump | None = None
        error: BaseException | None = None
        started = False
        try:
            await observed.admit()
            pump = observed.start_pump()
            batch = await pump.next_batch()
            while batch is not None:
                if not started:
                    started = True
                    observed.committed()
                for event in batch:
                    _collect_event(choices, event, observed)
                if observed.accounting is not None:
                    observed.accounting.on_events(batch)
                batch = await pump.next_batch()
            observed.usage = check_usage(observed.usage, backend)
            for i, choice in enumerate(choices):
                if choice.finish_reason is None:
                    raise UpstreamError(f"Backend `{backend}` ended without finishing choice {i}.", kind="bad_gateway")
        except BaseException as exc:
            error = exc
        finally:
            if pump is not None:
                await observed.close_pump(pump)
        if error is None:
            observed.end(None)
            return Served(body=_build_response(gateway, spec, choices, observed.usage), backend=backend)  # type: ignore[arg-type]
        if not started and observed.may_retry(error):
            continue
        observed.end(error, first_token=started)
        raise error


def _collect_event(choices: list[_Choice], event: Event, observed: Observed) -> None:
    if isinstance(event, Usage):
        observed.usage = event
        return
    if event.index >= len(choices):
        raise UpstreamError(f"The backend sent choice {event.index} of {len(choices)}.", kind="bad_gateway")
    choice = choices[event.index]
    if isinstance(event, TextDelta):
        if event.text or event.logprobs:
            observed.timer.mark_tokens()
        choice.text.append(event.text)
        if event.logprobs is not None:
            choice.logprobs = (choice.logprobs or []) + list(event.logprobs)
    elif isinstance(event, Finish):
        if choice.finish_reason is not None:
            raise UpstreamError(f"The backend finished choice {event.index} twice.", kind="bad_gateway")
        choice.finish_reason = event.reason
    elif isinstance(event, ToolCallDelta):
        call = choice.tool_calls.setdefault(event.tool_index, {"id": None, "name": "", "arguments": ""})
        call["id"] = event.id or call["id"]
        call["name"] = event.name or call["name"]
        call["arguments"] += event.arguments


def _usage_body(usage: Usage) -> S.UsageBody:
    details = None if usage.cached_tokens is None else S.PromptTokensDetails(cached_tokens=usage.cached_tokens)
    return S.UsageBody(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
        prompt_tokens_details=details,
    )


def _chat_logprobs(logprobs: list[TokenLogprob] | None) -> S.ChoiceLogprobs | None:
    if logprobs is None:
        return None
    content = [
        S.TokenLogprobBody(
            token=lp.token,
            logprob=lp.logprob,
            bytes=lp.bytes,
            top_logprobs=[S.TopLogprobBody(token=t.token, logprob=t.logprob, bytes=t.bytes) for t in lp.top_logprobs],
        )
        for lp in logprobs
    ]
    return S.ChoiceLogprobs(content=content)


def completion_logprobs(logprobs: list[TokenLogprob], offset: int) -> S.CompletionLogprobs:
    offsets = []
    for lp in logprobs:
        offsets.append(offset)
        offset += len(lp.token)
    return S.CompletionLogprobs(
        tokens=[lp.token for lp in logprobs],
        token_logprobs=[lp.logprob for lp in logprobs],
        top_logprobs=[{t.token: t.logprob for t in lp.top_logprobs} for lp in logprobs],
        text_offset=offsets,
    )


def _build_response(gateway: Gateway, spec: RequestSpec, choices: list[_Choice], usage: Usage) -> S.ChatCompletion | S.Completion:
    common = dict(
        id=response_id(spec),
        created=int(time.time()),
        model=spec.model,
        system_fingerprint=gateway.config.server.system_fingerprint,
        usage=_usage_body(usage),
    )
    if spec.kind == "completion":
        return S.Completion(
            choices=[
                S.CompletionChoice(
                    index=i,
                    text="".join(c.text),
                    logprobs=None if c.logprobs is None else completion_logprobs(c.logprobs, 0),
                    finish_reason=c.finish_reason,
                )
                for i, c in enumerate(choices)
            ],
            **common,
        )
    return S.ChatCompletion(
        choices=[
            S.ChatChoice(
                index=i,
                message=S.ChatMessageBody(
                    content="".join(c.text) if c.text or not c.tool_calls else None,
                    tool_calls=[
                        S.ToolCallBody(
                            id=call["id"] or f"call_{secrets.token_hex(12)}",
                            function=S.ToolCallFunctionBody(name=call["name"], arguments=call["arguments"]),
                        )
                        for _, call in sorted(c.tool_calls.items())
                    ]
                    or None,
                ),
                logprobs=_chat_logprobs(c.logprobs),
                finish_reason=c.finish_reason,
            )
            for i, c in enumerate(choices)
        ],
        **common,
    )



