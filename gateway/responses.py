"""Events → bytes: the streamed SSE body and the non-streaming response objects."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
import msgspec

from gateway import schemas as S
from gateway.errors import error_payload
from gateway.service import EventPump, Gateway, Resolved, RequestTimer, check_usage, is_token_event, outcome_of
from gateway.sse import DONE, ChunkEncoder, chat_logprobs_json, error_event
from plugins.errors import SwitchyardError, UpstreamError
from plugins.protocol import Event, Finish, RequestSpec, TextDelta, TokenLogprob, ToolCallDelta, Usage


def response_id(spec: RequestSpec) -> str:
    prefix = "chatcmpl-" if spec.kind == "chat" else "cmpl-"
    return prefix + secrets.token_hex(12)


@dataclass
class Observed:
    """Bookkeeping shared by both response kinds: hooks, metrics, the timer."""

    gateway: Gateway
    spec: RequestSpec
    resolved: Resolved
    timer: RequestTimer = field(default_factory=RequestTimer)
    usage: Usage | None = None

    def begin(self) -> None:
        self.gateway.pm.hook.switchyard_on_request(spec=self.spec, backend=self.resolved.backend)
        self.gateway.metrics.in_flight.labels(self.resolved.route.name, self.resolved.backend.name).inc()

    def end(self, error: BaseException | None) -> None:
        labels = (self.resolved.route.name, self.resolved.backend.name)
        m = self.gateway.metrics
        m.in_flight.labels(*labels).dec()
        outcome = outcome_of(error)
        m.requests.labels(*labels, outcome).inc()
        timings = self.timer.as_dict()
        m.e2e.labels(*labels).observe(timings["e2e"])
        if timings["ttft"] is not None:
            m.ttft.labels(*labels).observe(timings["ttft"])
        itl = m.itl.labels(*labels)
        for gap in timings["itl"]:
            itl.observe(gap)
        if self.usage is not None:
            m.tokens.labels(*labels, "prompt").inc(self.usage.prompt_tokens)
            m.tokens.labels(*labels, "completion").inc(self.usage.completion_tokens)
            if self.usage.cached_tokens:
                m.tokens.labels(*labels, "cached").inc(self.usage.cached_tokens)
        self.gateway.pm.hook.switchyard_on_response(
            spec=self.spec, backend=self.resolved.backend, usage=self.usage, outcome=outcome, timings=timings
        )


# -- streaming ------------------------------------------------------------------------------------


async def open_stream(gateway: Gateway, spec: RequestSpec, resolved: Resolved) -> AsyncIterator[bytes]:
    """Start the backend and wait for its first events, so that a failure before any token
    (context too long, upstream down) is still answered with a real HTTP status. Returns the
    SSE body iterator."""
    observed = Observed(gateway, spec, resolved)
    observed.begin()
    pump = EventPump(resolved.backend.generate(spec))
    try:
        first = await pump.next_batch()
    except BaseException as exc:
        await pump.close()
        observed.end(exc)
        raise
    return _sse_body(observed, pump, first)


async def _sse_body(observed: Observed, pump: EventPump, first: list[Event] | None) -> AsyncIterator[bytes]:
    spec = observed.spec
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
            out += state.feed(batch)
            if out:
                yield out
            out = b""
            batch = await pump.next_batch()
        observed.usage = check_usage(state.usage, observed.resolved.backend.name)
        state.check_complete(observed.resolved.backend.name)
        yield state.finish(observed.usage)
    except SwitchyardError as exc:
        error = exc
        payload = error_payload(exc)[1]
        observed.gateway.metrics.errors.labels(payload.error.type).inc()
        yield error_event(payload) + DONE
    except BaseException as exc:
        error = exc
        raise
    finally:
        with anyio.CancelScope(shield=True):
            await pump.close()
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


async def collect(gateway: Gateway, spec: RequestSpec, resolved: Resolved) -> S.ChatCompletion | S.Completion:
    observed = Observed(gateway, spec, resolved)
    observed.begin()
    choices = [_Choice() for _ in range(spec.sampling.n)]
    events = resolved.backend.generate(spec)
    error: BaseException | None = None
    try:
        async for event in events:
            _collect_event(choices, event, observed)
        observed.usage = check_usage(observed.usage, resolved.backend.name)
        for i, choice in enumerate(choices):
            if choice.finish_reason is None:
                raise UpstreamError(f"Backend `{resolved.backend.name}` ended without finishing choice {i}.", kind="bad_gateway")
    except BaseException as exc:
        error = exc
        raise
    finally:
        with anyio.CancelScope(shield=True):
            await events.aclose()  # type: ignore[attr-defined]
        observed.end(error)
    return _build_response(gateway, spec, choices, observed.usage)


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



