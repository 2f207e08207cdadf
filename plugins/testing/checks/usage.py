"""usage: the token counts a backend reports are the ones it spent."""

from __future__ import annotations

from plugins.contract.protocol import ReasoningDelta, TextDelta, ToolCallDelta
from plugins.testing.checks.prompts import STORY
from plugins.testing.probe import Probe
from plugins.testing.registry import check
from plugins.testing.trace import Failed


@check("usage", fix=(
    "Count prompt_tokens after the chat template, with the same tokenizer tokenize() uses (or have tokenize() "
    "raise InvalidRequest when the backend cannot tokenize); count every generated token, over all choices, in "
    "completion_tokens; report cached_tokens only up to prompt_tokens (None when unknown); count in reasoning_tokens "
    "the part of completion_tokens that came as ReasoningDeltas (None when not told apart)."))
async def usage(probe: Probe) -> str:
    """prompt_tokens equals tokenize() of the same input; completion_tokens ≥ 1 when text came; cached ≤ prompt;
    reasoning_tokens ≤ completion_tokens, and > 0 exactly when reasoning came."""
    asks = [("chat", probe.chat(STORY, max_tokens=8))]
    if probe.caps.supports_completions:
        asks.append(("completion", probe.completion("The capital of France is", max_tokens=8)))
    compared: list[str] = []
    for label, spec in asks:
        trace = (await probe.run(spec, label)).ok()
        usage = trace.usage
        assert usage is not None
        produced = any(isinstance(e, TextDelta | ReasoningDelta) and e.text or isinstance(e, ToolCallDelta)
                       for e in trace.events)
        if usage.prompt_tokens < 1:
            raise Failed(f"{label}: prompt_tokens is {usage.prompt_tokens}; a prompt is at least one token", trace)
        if produced and usage.completion_tokens < 1:
            raise Failed(f"{label}: text came but completion_tokens is {usage.completion_tokens}", trace)
        limit = (spec.sampling.max_tokens or 0) * spec.sampling.n
        if usage.completion_tokens > limit:
            raise Failed(f"{label}: completion_tokens is {usage.completion_tokens}, more than max_tokens x n = {limit}",
                         trace)
        if usage.cached_tokens is not None and not 0 <= usage.cached_tokens <= usage.prompt_tokens:
            raise Failed(f"{label}: cached_tokens is {usage.cached_tokens}, outside 0..prompt_tokens "
                         f"({usage.prompt_tokens})", trace)
        reasoning_problem = _reasoning_problem(trace.events, usage.reasoning_tokens, usage.completion_tokens)
        if reasoning_problem:
            raise Failed(f"{label}: {reasoning_problem}", trace)
        counted = await probe.prompt_tokens(spec)
        if counted is not None and counted != usage.prompt_tokens:
            raise Failed(f"{label}: Usage says prompt_tokens={usage.prompt_tokens}, but tokenize() counts {counted} "
                         "tokens for the same input", trace)
        compared.append(f"{label} {usage.prompt_tokens}" + (" = tokenize()" if counted is not None else "")
                        + (f" (reasoning {usage.reasoning_tokens} of {usage.completion_tokens})"
                           if usage.reasoning_tokens else ""))
    note = "" if all("tokenize" in c for c in compared) else " (tokenize() not offered: prompt counts not compared)"
    return f"prompt_tokens: {', '.join(compared)}{note}"


def _reasoning_problem(events: list, reasoning_tokens: int | None, completion_tokens: int) -> str | None:
    if reasoning_tokens is None:
        return None
    reasoned = any(isinstance(e, ReasoningDelta) for e in events)
    if not 0 <= reasoning_tokens <= completion_tokens:
        return f"reasoning_tokens is {reasoning_tokens}, outside 0..completion_tokens ({completion_tokens})"
    if reasoning_tokens and not reasoned:
        return f"reasoning_tokens is {reasoning_tokens}, but no ReasoningDelta came"
    if reasoned and not reasoning_tokens:
        return "ReasoningDeltas came, but reasoning_tokens is 0"
    return None
