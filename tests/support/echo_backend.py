"""A deterministic backend for the gateway's contract tests; never in the shipped plugins.toml.

It "generates" by echoing the last message's words back, one word per token, so every test can
predict the exact text, token counts and finish reasons. Magic prompts make it fail on purpose:
`FAIL:<kind>` before the first token, `FAILMID:<n>` after n tokens. The options `fail` and
`fail_after` do the same for every request, and `answer_prefix` puts a word before every answer,
so routing tests can tell the backends of a route apart; `seed_random` seeds the server process's
`random` at start-up, so a weighted route's split through a real server is the same on every run.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec

from plugins import hookimpl
from plugins.contract.config_types import BackendType
from plugins.contract.errors import ContextLengthExceeded, InvalidRequest, Overloaded, UpstreamError
from plugins.contract.protocol import (
    EXTENSIONS,
    Capabilities,
    Event,
    Finish,
    ModelInfo,
    Rendered,
    RequestSpec,
    TextDelta,
    TokenizeRequest,
    TokenizeResult,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from plugins.parsers.reasoning import ReasoningSplitter, choose_parser, split_reasoning


class EchoOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    models: list[str] = msgspec.field(default_factory=lambda: ["echo-1"])
    token_delay_s: float = 0.0
    max_model_len: int = 256
    extensions: list[str] = msgspec.field(default_factory=lambda: sorted(EXTENSIONS - {"structured_outputs", "continuous_usage_stats"}))
    cancel_log: str | None = None  # a file where each cancelled request id is appended
    healthy: bool = True
    answer_prefix: str = ""  # a word put before every answer (one more token)
    fail: str | None = None  # every request fails before its first token, as with `FAIL:<kind>`
    fail_after: int | None = None  # every request fails after this many tokens, as with `FAILMID:<n>`
    reasoning_parser: str = "none"  # "deepseek_r1": `<think> ... </think>` words become reasoning
    # seeds the serving process's `random` when the backend starts: a `weighted` route's picks
    # through a real server are then the same on every run
    seed_random: int | None = None


def prompt_words(spec: RequestSpec | TokenizeRequest) -> list[str]:
    if spec.messages is not None:
        words: list[str] = []
        for m in spec.messages:
            content = m.get("content") or ""
            if isinstance(content, list):
                content = " ".join(p.get("text", "") for p in content)
            words += [f"<{m['role']}>", *content.split()]
        return words
    prompt = spec.prompt
    if isinstance(prompt, list):
        return [str(t) for t in prompt]
    return (prompt or "").split()


def answer_words(spec: RequestSpec) -> list[str]:
    if spec.messages is not None:
        last = spec.messages[-1].get("content") or ""
        if isinstance(last, list):
            last = " ".join(p.get("text", "") for p in last)
        return last.split()
    return prompt_words(spec)


class EchoBackend:
    def __init__(self, name: str, options: EchoOptions) -> None:
        self.name = name
        self.options = options
        self.started = False
        self.in_flight = 0

    def capabilities(self) -> Capabilities:
        return Capabilities(
            extensions=frozenset(self.options.extensions),
            reports_cached_tokens=True,
            max_model_len=self.options.max_model_len,
            supports_logprobs=True,
        )

    async def start(self) -> None:
        self.started = True
        if self.options.seed_random is not None:
            random.seed(self.options.seed_random)

    async def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=m, max_model_len=self.options.max_model_len, owned_by=self.name) for m in self.options.models]

    async def health(self) -> bool:
        return self.options.healthy

    async def close(self) -> None:
        self.started = False

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        words = prompt_words(request)
        return TokenizeResult(tokens=[len(w) for w in words], max_model_len=self.options.max_model_len)

    async def render(self, upstream_model: str, messages: list[dict], *, add_generation_prompt: bool = True,
                     chat_template_kwargs: dict | None = None, tools: list[dict] | None = None) -> Rendered:
        words = prompt_words(TokenizeRequest(upstream_model=upstream_model, messages=messages))
        # two arms with different answer prefixes render differently, as two templates would
        words = [self.options.answer_prefix + w for w in words]
        return Rendered(text=" ".join(words), tokens=[len(w) for w in words], token_strs=words)

    async def detokenize(self, upstream_model: str, tokens: list[int]) -> str:
        return " ".join("x" * t for t in tokens)

    def generate(self, spec: RequestSpec) -> AsyncIterator[Event]:
        factory = choose_parser(self.options.reasoning_parser, template_source=None, prompt_text=None,
                                chat_template_kwargs=spec.chat_template_kwargs)
        events = self._echo(spec)
        return events if factory is None or spec.kind != "chat" else split_reasoning(events, ReasoningSplitter(factory))

    async def _echo(self, spec: RequestSpec) -> AsyncIterator[Event]:
        words = answer_words(spec)
        if self.options.answer_prefix:
            words = [self.options.answer_prefix, *words]
        prompt_tokens = len(prompt_words(spec))
        forced = [f"FAIL:{self.options.fail}"] if self.options.fail else []
        _maybe_fail_early(forced + words, prompt_tokens, spec, self.options.max_model_len)
        fail_mid = _fail_mid(words) if self.options.fail_after is None else self.options.fail_after
        limit = spec.sampling.max_tokens or self.options.max_model_len - prompt_tokens
        self.in_flight += 1
        try:
            completion = 0
            for index in range(spec.sampling.n):
                emitted = 0
                for i, word in enumerate(words[:limit]):
                    if fail_mid is not None and emitted >= fail_mid:
                        raise UpstreamError("The upstream connection broke mid-stream.", kind="bad_gateway")
                    if word in spec.sampling.stop:
                        break
                    if self.options.token_delay_s:
                        await asyncio.sleep(self.options.token_delay_s)
                    text = word if i == 0 else " " + word
                    logprobs = _logprobs(text, spec) if spec.sampling.logprobs else None
                    yield TextDelta(text=text, index=index, token_ids=(len(word),), logprobs=logprobs)
                    emitted += 1
                completion += emitted
                stopped_early = emitted < len(words[:limit]) or len(words) <= limit
                yield Finish(reason="stop" if stopped_early else "length", index=index)
            yield Usage(prompt_tokens=prompt_tokens, completion_tokens=completion, cached_tokens=prompt_tokens // 2)
        except (asyncio.CancelledError, GeneratorExit):
            if self.options.cancel_log:
                with Path(self.options.cancel_log).open("a") as f:
                    f.write(f"{spec.request_id} {time.time()}\n")
            raise
        finally:
            self.in_flight -= 1


def _logprobs(text: str, spec: RequestSpec) -> list[TokenLogprob]:
    top = [TopLogprob(token=text, logprob=-0.5, bytes=list(text.encode()))]
    top += [TopLogprob(token=f"alt{i}", logprob=-2.0 - i, bytes=list(f"alt{i}".encode())) for i in range(spec.sampling.top_logprobs - 1)]
    return [TokenLogprob(token=text, logprob=-0.5, bytes=list(text.encode()), top_logprobs=top[: spec.sampling.top_logprobs])]


def _maybe_fail_early(words: list[str], prompt_tokens: int, spec: RequestSpec, max_model_len: int) -> None:
    for word in words:
        if word == "FAIL:overloaded":
            raise Overloaded("The engine's queue is full.", retry_after_s=1)
        if word == "FAIL:unavailable":
            raise UpstreamError("The upstream is unavailable.", kind="unavailable")
        if word == "FAIL:timeout":
            raise UpstreamError("The upstream did not answer in time.", kind="timeout")
        if word == "FAIL:bad_gateway":
            raise UpstreamError("The upstream sent garbage.", kind="bad_gateway")
        if word == "FAIL:invalid":
            raise InvalidRequest("The backend refused this request.", param="messages")
        if word == "FAIL:bug":
            raise RuntimeError("a real bug")
    wanted = prompt_tokens + (spec.sampling.max_tokens or 0)
    if prompt_tokens >= max_model_len or wanted > max_model_len:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {max_model_len} tokens; the request has {prompt_tokens} "
            f"prompt tokens and asks for {spec.sampling.max_tokens or 0} more.",
            param="prompt" if spec.kind == "completion" else "messages", prompt_tokens=prompt_tokens,
            max_model_len=max_model_len, max_tokens=spec.sampling.max_tokens,
        )


def _fail_mid(words: list[str]) -> int | None:
    for word in words:
        if word.startswith("FAILMID:"):
            return int(word.split(":")[1])
    return None


@hookimpl
def switchyard_backend_types() -> list[BackendType]:
    return [BackendType(name="echo", options=EchoOptions, create=EchoBackend, description="test backend")]
