"""capabilities: what a backend declares is what it does.

Each extension of `plugins.contract.protocol.EXTENSIONS` has a sample value here (a test fails when one
is missing, so the check grows with the protocol), and where the battery can observe an
extension's effect it has a probe in `HONOURED`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from plugins.contract.errors import InvalidRequest
from plugins.contract.protocol import EXTENSIONS
from plugins.testing.checks.prompts import REFERENCE_TOKENS, SHORT, STORY, pick_stop, reference
from plugins.testing.probe import Probe
from plugins.testing.registry import check
from plugins.testing.trace import Failed

# one body fragment per extension: what a client sends to use it
EXTENSION_SAMPLES: dict[str, dict[str, Any]] = {
    "top_k": {"top_k": 5},
    "min_p": {"min_p": 0.05},
    "repetition_penalty": {"repetition_penalty": 1.1},
    "priority": {"priority": 1},
    "structured_outputs": {"structured_outputs": {"choice": ["yes", "no"]}},
    "chat_template": {"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"},
    "chat_template_kwargs": {"chat_template_kwargs": {}},
    "add_generation_prompt": {"add_generation_prompt": True},
    "continue_final_message": {"continue_final_message": False},
    "include_stop_str_in_output": {"include_stop_str_in_output": True},
    "skip_special_tokens": {"skip_special_tokens": True},
    "min_tokens": {"min_tokens": 1},
    "ignore_eos": {"ignore_eos": False},
    "stop_token_ids": {"stop_token_ids": [0]},
    "continuous_usage_stats": {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
}
SHORT_LIMIT = 8  # tokens: SHORT's answer must end before this for min_tokens / ignore_eos to be observable


@check("capabilities", fix=(
    "List in Capabilities.extensions exactly the extensions generate() honours (names from "
    "plugins.contract.protocol.EXTENSIONS), and set supports_logprobs / supports_tools / max_n / supports_completions "
    "to what the backend does; an extension it lists must change the output as vLLM's does (top_k=1 is greedy)."))
async def capabilities(probe: Probe) -> str:
    """Extensions declared unsupported are refused by the gateway; declared ones are honoured where it can tell."""
    declared = probe.caps.extensions
    unknown = sorted(declared - EXTENSIONS)
    if unknown:
        raise Failed(f"Capabilities.extensions names {unknown}, which are not extensions "
                     f"(known: {sorted(EXTENSIONS)})")
    for name in sorted(EXTENSIONS - declared):
        spec = probe.chat(SHORT, max_tokens=2, **EXTENSION_SAMPLES[name])
        refusal = probe.refusal(spec)
        if not isinstance(refusal, InvalidRequest) or refusal.param != name:
            raise Failed(f"the gateway would send `{name}` to this backend, which does not declare it "
                         f"(its answer: {refusal!r})")
    notes = [f"{len(EXTENSIONS - declared)} undeclared extensions refused by the gateway"]
    for name in sorted(declared & HONOURED.keys()):
        notes.append(await HONOURED[name](probe))
    if probe.caps.supports_logprobs:
        notes.append(await _logprobs(probe))
    unobserved = sorted(declared - HONOURED.keys())
    if unobserved:
        notes.append(f"not observable here: {', '.join(unobserved)}")
    return "; ".join(notes)


async def _top_k(probe: Probe) -> str:
    greedy = await reference(probe)
    spec = probe.chat(STORY, max_tokens=REFERENCE_TOKENS, stream=True, temperature=1.0, top_k=1, seed=3)
    trace = (await probe.run(spec, "chat, temperature 1, top_k=1")).ok()
    if trace.text() != greedy.text():
        raise Failed("top_k=1 at temperature 1 should pick the most likely token every time, as temperature 0 "
                     f"does: {trace.text()!r} differs from the greedy {greedy.text()!r}", trace, greedy)
    return "top_k=1 equals greedy"


async def _short_answer(probe: Probe) -> tuple[Any, bool]:
    """SHORT's plain answer, and whether it ends on its own early enough to tell min_tokens and
    ignore_eos apart from it."""

    async def send() -> Any:
        return (await probe.run(probe.chat(SHORT, max_tokens=16), "chat, a one-word answer")).ok()

    trace = await probe.memo("short", send)
    usage = trace.usage
    return trace, trace.finish() == "stop" and usage.completion_tokens < SHORT_LIMIT


async def _min_tokens(probe: Probe) -> str:
    plain, observable = await _short_answer(probe)
    if not observable:
        return "min_tokens not observable (the short answer is not short)"
    trace = (await probe.run(probe.chat(SHORT, max_tokens=16, min_tokens=SHORT_LIMIT),
                             f"chat, min_tokens={SHORT_LIMIT}")).ok()
    if trace.usage.completion_tokens < SHORT_LIMIT:  # type: ignore[union-attr]
        raise Failed(f"min_tokens={SHORT_LIMIT} but only {trace.usage.completion_tokens} tokens came",  # type: ignore[union-attr]
                     trace, plain)
    return "min_tokens honoured"


async def _ignore_eos(probe: Probe) -> str:
    plain, observable = await _short_answer(probe)
    if not observable:
        return "ignore_eos not observable (the short answer is not short)"
    trace = (await probe.run(probe.chat(SHORT, max_tokens=SHORT_LIMIT, ignore_eos=True),
                             f"chat, ignore_eos, max_tokens={SHORT_LIMIT}")).ok()
    if trace.finish() != "length":
        raise Failed(f"with ignore_eos the answer should run to max_tokens={SHORT_LIMIT} ('length'); it finished "
                     f"with {trace.finish()!r}", trace, plain)
    return "ignore_eos honoured"


async def _include_stop(probe: Probe) -> str:
    text = (await reference(probe)).text()
    stop = pick_stop(text)
    if stop is None:
        return "include_stop_str_in_output not observable (short reference)"
    spec = probe.chat(STORY, max_tokens=REFERENCE_TOKENS, stream=True, stop=[stop], include_stop_str_in_output=True)
    trace = (await probe.run(spec, f"chat, stop=[{stop!r}], include_stop_str_in_output")).ok()
    expected = text[: text.find(stop) + len(stop)]
    if trace.text() != expected:
        raise Failed(f"with include_stop_str_in_output the text should end with the stop string: {expected!r}, "
                     f"got {trace.text()!r}", trace)
    return "include_stop_str_in_output honoured"


async def _logprobs(probe: Probe) -> str:
    spec = probe.chat(SHORT, max_tokens=4, logprobs=True, top_logprobs=2)
    trace = (await probe.run(spec, "chat, logprobs, top_logprobs=2")).ok()
    if not any(getattr(e, "logprobs", None) for e in trace.events):
        raise Failed("supports_logprobs is declared, but no TextDelta carried logprobs", trace)
    return "logprobs come"


HONOURED: dict[str, Callable[[Probe], Awaitable[str]]] = {
    "top_k": _top_k,
    "min_tokens": _min_tokens,
    "ignore_eos": _ignore_eos,
    "include_stop_str_in_output": _include_stop,
}
