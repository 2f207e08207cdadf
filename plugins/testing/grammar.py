"""The event grammar of `plugins.contract.protocol`, as a list of the rules a sequence breaks:

    per choice i in range(n): TextDelta / ReasoningDelta / ToolCallDelta ...  then one Finish(i)
    then exactly one Usage, last

plus: a Finish reason is one the protocol knows (with a `stop_sequence` only when it is "stop"),
"tool_calls" only after a tool call, a tool call's first fragment names its id and function, its
joined arguments are one JSON value (unless max_tokens cut the choice short), a TextDelta is
empty only when it carries logprobs, and a ReasoningDelta only when it carries token ids
(reasoning, like text, belongs to its choice and comes before that choice's Finish). A new event
type adds its rule here.
"""

from __future__ import annotations

import json
import typing

from plugins.contract.protocol import Event, Finish, FinishReason, ReasoningDelta, TextDelta, ToolCallDelta, Usage

REASONS = frozenset(typing.get_args(FinishReason))
KNOWN = (TextDelta, ReasoningDelta, ToolCallDelta, Finish, Usage)


def grammar_problems(events: list[Event], n: int) -> list[str]:
    problems: list[str] = []
    finished: dict[int, int] = {}  # choice -> Finish events seen
    cut: set[int] = set()  # choices that finished with "length" (a tool call may be cut short)
    calls: dict[tuple[int, int], list[ToolCallDelta]] = {}
    usage_at: list[int] = []
    for position, event in enumerate(events, 1):
        if not isinstance(event, KNOWN):
            problems.append(f"event {position} is a {type(event).__name__}, not a protocol event")
            continue
        if isinstance(event, Usage):
            usage_at.append(position)
            continue
        if usage_at:
            problems.append(f"event {position} ({type(event).__name__}) comes after the Usage")
        index = event.index
        if not 0 <= index < n:
            problems.append(f"event {position} is for choice {index}, but the request asked for n={n}")
            continue
        if isinstance(event, Finish):
            finished[index] = finished.get(index, 0) + 1
            if event.reason == "length":
                cut.add(index)
            if event.reason not in REASONS:
                problems.append(f"choice {index} finishes with {event.reason!r}, not one of {sorted(REASONS)}")
            if event.stop_sequence is not None and event.reason != "stop":
                problems.append(f"choice {index} names stop_sequence {event.stop_sequence!r} but finishes with "
                                f"{event.reason!r}, not 'stop'")
            if event.reason == "tool_calls" and not any(c for (i, _), c in calls.items() if i == index):
                problems.append(f"choice {index} finishes with 'tool_calls' but made no tool call")
            continue
        if finished.get(index):
            problems.append(f"event {position} ({type(event).__name__}) for choice {index} comes after its Finish")
        if isinstance(event, TextDelta) and not event.text and not event.logprobs:
            problems.append(f"event {position} is an empty TextDelta without logprobs")
        if isinstance(event, ReasoningDelta) and not event.text and not event.token_ids:
            problems.append(f"event {position} is an empty ReasoningDelta without token ids")
        if isinstance(event, ToolCallDelta):
            calls.setdefault((index, event.tool_index), []).append(event)
    for index in range(n):
        count = finished.get(index, 0)
        if count != 1:
            problems.append(f"choice {index} has {count} Finish events; exactly one is expected")
    if len(usage_at) != 1:
        problems.append(f"{len(usage_at)} Usage events; exactly one is expected, last")
    elif usage_at[0] != len(events):
        problems.append(f"the Usage is event {usage_at[0]} of {len(events)}; it must be the last")
    problems += _tool_call_problems(calls, cut)
    return problems


def _tool_call_problems(calls: dict[tuple[int, int], list[ToolCallDelta]], cut: set[int]) -> list[str]:
    problems = []
    for (index, tool_index), fragments in sorted(calls.items()):
        where = f"tool call {tool_index} of choice {index}"
        if not fragments[0].id or not fragments[0].name:
            problems.append(f"{where}: its first fragment lacks an id or a function name")
        if index in cut:
            continue
        arguments = "".join(f.arguments for f in fragments)
        try:
            json.loads(arguments)
        except ValueError:
            problems.append(f"{where}: its arguments joined are not JSON: {arguments[:200]!r}")
    return problems
