"""Chat and legacy completions: events → the streamed SSE body and the response objects."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from gateway.chat_api import schemas as S
from gateway.chat_api.chunks import DONE, ChunkEncoder, chat_logprobs_json, error_event
from gateway.errors import ErrorResponse
from gateway.ids import token_hex
from gateway.service.accounting import RequestAccounting
from gateway.service.attempts import Answer, collect_events, open_events, stream_body
from gateway.service.gateway import Gateway
from plugins.contract.errors import SwitchyardError, UpstreamError
from plugins.contract.protocol import (
    Event,
    Finish,
    ReasoningDelta,
    RequestSpec,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    Usage,
)


def response_id(spec: RequestSpec) -> str:
    prefix = "chatcmpl-" if spec.kind == "chat" else "cmpl-"
    return prefix + token_hex(12)


# -- streaming ------------------------------------------------------------------------------------


async def open_stream(gateway: Gateway, spec: RequestSpec, accounting: RequestAccounting | None = None) -> Answer:
    """The request started (see `gateway.service.attempts.open_events`); returns the SSE body."""
    opened = await open_events(gateway, spec, accounting=accounting)
    encoder = ChunkEncoder(
        id=response_id(spec),
        created=int(time.time()),
        model=spec.model,
        fingerprint=gateway.config.server.system_fingerprint,
        chat=spec.kind == "chat",
        include_usage=spec.include_usage,
        reasoning_field=gateway.config.server.reasoning_field,
    )
    return Answer(body=stream_body(opened, _StreamState(encoder, spec)), backend=opened.backend)


class _StreamState:
    """Per-request stream state: which choices have started and finished, the usage."""

    def __init__(self, encoder: ChunkEncoder, spec: RequestSpec) -> None:
        self.encoder = encoder
        self.spec = spec
        self.n = spec.sampling.n
        self.finished: set[int] = set()
        self.continuous = spec.include_usage and spec.continuous_usage_stats  # usage on every chunk
        # per choice: characters of token text sent so far (legacy completions' `text_offset`)
        self.text_offsets: dict[int, int] = {}
        # `feed([TextDelta(text=text, index=index)])` of a plain token's non-empty text
        self.feed_text: Callable[[int, str], bytes] = encoder.plain_text

    def start(self, first: list[Event]) -> bytes:
        if self.continuous:
            for event in first:  # a backend's running usage before its first token
                if not isinstance(event, Usage):
                    break
                self.encoder.set_usage(event)
        if not self.encoder.chat:
            return b""
        return b"".join(self.encoder.role(i) for i in range(self.n))

    def feed(self, batch: list[Event]) -> bytes:
        if len(batch) == 1 and type(event := batch[0]) is TextDelta and event.text and event.logprobs is None:
            return self.encoder.plain_text(event.index, event.text)  # one plain token (most batches): what the loop gives
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
            elif isinstance(event, ReasoningDelta):
                if event.text:
                    parts.append(self.encoder.reasoning(event.index, event.text))
            elif isinstance(event, ToolCallDelta):
                parts.append(self.encoder.tool_call(event))
            elif isinstance(event, Usage) and self.continuous:
                self.encoder.set_usage(event)
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

    async def finish(self, usage: Usage) -> bytes:
        missing = set(range(self.n)) - self.finished
        if missing:
            raise UpstreamError(f"The backend ended without finishing choice {min(missing)}.", kind="bad_gateway")
        return (self.encoder.usage(usage) if self.spec.include_usage else b"") + DONE

    async def error(self, error: SwitchyardError, payload: ErrorResponse) -> bytes:
        return error_event(payload) + DONE


def _encode_completion_logprobs(logprobs: list[TokenLogprob], offset: int) -> bytes:
    return msgspec.json.encode(completion_logprobs(logprobs, offset=offset))


# -- non-streaming --------------------------------------------------------------------------------


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    tool_calls: dict[int, dict] = field(default_factory=dict)
    finish_reason: str | None = None
    reasoning: list[str] = field(default_factory=list)


class _Choices:
    """The non-streamed answer being assembled: text, reasoning, logprobs, tool calls per choice."""

    def __init__(self, n: int) -> None:
        self.choices = [_Choice() for _ in range(n)]

    def feed(self, event: Event) -> None:
        if isinstance(event, Usage):
            return
        if event.index >= len(self.choices):
            raise UpstreamError(f"The backend sent choice {event.index} of {len(self.choices)}.", kind="bad_gateway")
        choice = self.choices[event.index]
        if isinstance(event, TextDelta):
            choice.text.append(event.text)
            if event.logprobs is not None:
                choice.logprobs = (choice.logprobs or []) + list(event.logprobs)
        elif isinstance(event, ReasoningDelta):
            choice.reasoning.append(event.text)
        elif isinstance(event, Finish):
            if choice.finish_reason is not None:
                raise UpstreamError(f"The backend finished choice {event.index} twice.", kind="bad_gateway")
            choice.finish_reason = event.reason
        elif isinstance(event, ToolCallDelta):
            call = choice.tool_calls.setdefault(event.tool_index, {"id": None, "name": "", "arguments": ""})
            call["id"] = event.id or call["id"]
            call["name"] = event.name or call["name"]
            call["arguments"] += event.arguments

    def check_complete(self, backend: str) -> None:
        for i, choice in enumerate(self.choices):
            if choice.finish_reason is None:
                raise UpstreamError(f"Backend `{backend}` ended without finishing choice {i}.", kind="bad_gateway")


async def collect(gateway: Gateway, spec: RequestSpec, accounting: RequestAccounting | None = None) -> Answer:
    """Run the request to its end (see `gateway.service.attempts.collect_events`) and build the response object."""
    sink, usage, backend = await collect_events(gateway, spec, lambda: _Choices(spec.sampling.n), accounting=accounting)
    return Answer(body=_build_response(gateway, spec, sink.choices, usage), backend=backend)


def _reasoning_fields(gateway: Gateway, reasoning: list[str]) -> dict[str, str]:
    if not reasoning:
        return {}
    text = "".join(reasoning)
    field = gateway.config.server.reasoning_field
    names = ("reasoning_content", "reasoning") if field == "both" else (field,)
    return {name: text for name in names}


def _usage_body(usage: Usage) -> S.UsageBody:
    details = None if usage.cached_tokens is None else S.PromptTokensDetails(cached_tokens=usage.cached_tokens)
    reasoning = None if usage.reasoning_tokens is None else S.CompletionTokensDetails(reasoning_tokens=usage.reasoning_tokens)
    return S.UsageBody(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
        prompt_tokens_details=details,
        completion_tokens_details=reasoning,
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
                    **_reasoning_fields(gateway, c.reasoning),
                    tool_calls=[
                        S.ToolCallBody(
                            id=call["id"] or f"call_{token_hex(12)}",
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



