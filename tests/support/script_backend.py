"""A deterministic backend that plays a script from the last message, for the front-ends'
contract tests (Messages, embeddings): the echo backend (one word per token, its `FAIL:` words,
delays and cancel log) plus what a real engine also produces:

- `THINK a b c ANSWER x y`: reasoning `a b c` (ReasoningDelta events), then the text `x y`;
- `CALL <tool> <word>`: a call of `<tool>` with arguments `{"city": "<word>"}`, sent in two
  fragments; it finishes "tool_calls" (or "stop" when `tool_choice` named the tool, as vLLM);
- `CALLJSON <tool> <json>`: a call of `<tool>` whose arguments are the rest of the message (the
  words joined by single spaces), sent in two fragments, finishing as `CALL` does. Either may
  stand anywhere in the text (an agent CLI puts its own reminders before the user's words);
- a word that is one of the request's stop strings ends the text, and `Finish` names it;
- a `tool` message last: the answer is `result: <its content>`;
- the script is read from the last message that is not a system message (an agent CLI's
  environment turn may follow the user's);
- `embed()`: each input's vector is a fixed function of its text (or token ids), unit length,
  `dimensions` long when asked (the vector's first components, renormalized), 8 by default.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec

from plugins import hookimpl
from plugins.contract.config_types import BackendType
from plugins.contract.errors import InvalidRequest, UpstreamError
from plugins.contract.protocol import (
    Capabilities,
    EmbedRequest,
    EmbedResult,
    Event,
    Finish,
    ReasoningDelta,
    RequestSpec,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from tests.support.echo_backend import EchoBackend, EchoOptions, _fail_mid, _maybe_fail_early, prompt_words

EMBEDDING_SIZE = 8


class ScriptOptions(EchoOptions, kw_only=True):
    embeddings: bool = True  # serves embed()
    matryoshka: bool = True  # `dimensions` may shorten the vectors


class ScriptBackend(EchoBackend):
    options: ScriptOptions

    def capabilities(self) -> Capabilities:
        return msgspec.structs.replace(super().capabilities(), supports_tools=True,
                                       supports_embeddings=self.options.embeddings)

    def script(self, spec: RequestSpec) -> list[Event]:
        """Every event but the usage, in order."""
        last = next((m for m in reversed(spec.messages or []) if m.get("role") != "system"), {})
        content = last.get("content") or ""
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content)
        words = content.split()
        if last.get("role") == "tool":
            words = ["result:", *words]
        events: list[Event] = []
        if words[:1] == ["THINK"]:
            cut = words.index("ANSWER") if "ANSWER" in words else len(words)
            events += [ReasoningDelta(text=w if i == 0 else " " + w) for i, w in enumerate(words[1:cut])]
            words = words[cut + 1:]
        calls = [i for i, w in enumerate(words) if w in ("CALL", "CALLJSON")] if last.get("role") != "tool" else []
        if calls and len(words) >= calls[0] + 3:
            named = isinstance(spec.tool_choice, dict)
            at = calls[0]
            if words[at] == "CALL":
                call_id = "call_" + words[at + 2].lower()
                fragments = ('{"city": ', msgspec.json.encode(words[at + 2]).decode() + "}")
            else:
                arguments = " ".join(words[at + 2:])
                call_id = "call_" + hashlib.sha256(arguments.encode()).hexdigest()[:12]
                fragments = (arguments[:len(arguments) // 2], arguments[len(arguments) // 2:])
            events += [
                ToolCallDelta(tool_index=0, id=call_id, name=words[at + 1], arguments=fragments[0]),
                ToolCallDelta(tool_index=0, arguments=fragments[1]),
                Finish(reason="stop" if named else "tool_calls"),
            ]
            return events
        limit = spec.sampling.max_tokens or self.options.max_model_len
        for i, word in enumerate(words):
            if word in spec.sampling.stop:
                return events + [Finish(reason="stop", stop_sequence=word)]
            if i == limit:
                return events + [Finish(reason="length")]
            events.append(TextDelta(text=word if i == 0 else " " + word))
        return events + [Finish(reason="stop")]

    async def generate(self, spec: RequestSpec) -> AsyncIterator[Event]:
        words = (spec.messages or [{}])[-1].get("content") or ""
        words = words.split() if isinstance(words, str) else []
        prompt_tokens = len(prompt_words(spec))
        _maybe_fail_early(words, prompt_tokens, spec, self.options.max_model_len)
        fail_mid = _fail_mid(words)
        self.in_flight += 1
        try:
            emitted = 0
            for event in self.script(spec):
                if not isinstance(event, Finish):
                    if fail_mid is not None and emitted >= fail_mid:
                        raise UpstreamError("The upstream connection broke mid-stream.", kind="bad_gateway")
                    if self.options.token_delay_s:
                        await asyncio.sleep(self.options.token_delay_s)
                    emitted += 1
                yield event
            yield Usage(prompt_tokens=prompt_tokens, completion_tokens=emitted, cached_tokens=prompt_tokens // 2)
        except (asyncio.CancelledError, GeneratorExit):
            self._log_cancel(spec.request_id)
            raise
        finally:
            self.in_flight -= 1

    def _log_cancel(self, request_id: str) -> None:
        if self.options.cancel_log:
            with Path(self.options.cancel_log).open("a") as f:
                f.write(f"{request_id} {time.time()}\n")

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        size = EMBEDDING_SIZE
        if request.dimensions is not None:
            if not self.options.matryoshka or request.dimensions > EMBEDDING_SIZE:
                raise InvalidRequest(f"Model `{request.upstream_model}` cannot make {request.dimensions}-dimensional "
                                     "embeddings.", param="dimensions")
            size = request.dimensions
        if self.options.token_delay_s:
            try:
                await asyncio.sleep(self.options.token_delay_s * 40)
            except asyncio.CancelledError:
                self._log_cancel(request.request_id)
                raise
        vectors, tokens = [], 0
        for item in request.inputs:
            text = item if isinstance(item, str) else " ".join(map(str, item))
            tokens += len(item.split()) if isinstance(item, str) else len(item)
            digest = hashlib.sha256(text.encode()).digest()
            vector = [b - 127.5 for b in digest[:size]]
            norm = math.sqrt(sum(v * v for v in vector))
            vectors.append([v / norm for v in vector])
        return EmbedResult(embeddings=vectors, prompt_tokens=tokens)


@hookimpl
def switchyard_backend_types() -> list[BackendType]:
    return [BackendType(name="script", options=ScriptOptions, create=ScriptBackend, description="test backend")]
