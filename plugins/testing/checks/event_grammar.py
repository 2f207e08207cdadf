"""event_grammar: every stream follows the protocol's event grammar, per choice, and says which
replica served it in the protocol's terms when it says so at all (`ReportsServedBy`)."""

from __future__ import annotations

from plugins.testing.checks.prompts import STORY, WEATHER_TOOL
from plugins.testing.grammar import grammar_problems
from plugins.testing.probe import Probe
from plugins.testing.registry import check
from plugins.testing.trace import Failed, describe_error


@check("event_grammar", fix=(
    "Yield, per choice index, any TextDelta / ReasoningDelta / ToolCallDelta, then exactly one Finish(reason, "
    "index) with reason 'stop', 'length' or 'tool_calls'; after every choice has finished, exactly one Usage, "
    "and nothing after it. A tool call's first ToolCallDelta carries its id and name, and its argument "
    "fragments join into JSON. A stream's served_by, when it has one, is None or the replica's base URL."))
async def event_grammar(probe: Probe) -> str:
    """Deltas per choice, exactly one Finish per choice with a known reason, exactly one Usage, last."""
    caps = probe.caps
    asks = [("chat, stream, n=1", probe.chat(STORY, max_tokens=16, stream=True), 1)]
    if probe.allows_n(2):
        asks.append(("chat, stream, n=2, temperature 1",
                     probe.chat(STORY, max_tokens=12, n=2, temperature=1, seed=7, stream=True), 2))
    if caps.supports_completions:
        asks.append(("completion, n=1", probe.completion("Once upon a time", max_tokens=12), 1))
    if caps.supports_tools:
        asks.append(("chat with tools, tool_choice 'required'",
                     probe.chat("What is the weather in Paris?", tools=[WEATHER_TOOL], tool_choice="required",
                                max_tokens=128), 1))
    for label, spec, n in asks:
        trace = await probe.run(spec, label)
        if trace.error is not None:
            raise Failed(f"{label}: the backend raised {describe_error(trace.error)}", trace)
        problems = grammar_problems(trace.events, n)
        if problems:
            raise Failed(f"{label}: " + "; ".join(problems[:3]), trace)
        if trace.served_by is not None and not (isinstance(trace.served_by, str) and trace.served_by):
            raise Failed(f"{label}: the stream's served_by is {trace.served_by!r}, neither None nor a replica's "
                         "base URL", trace)
    return f"{len(asks)} streams well-formed ({'; '.join(a[0] for a in asks)})"
