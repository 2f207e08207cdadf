"""The event grammar, rule by rule (the battery's event_grammar check applies it to real streams)."""

from __future__ import annotations

import pytest

from plugins.contract.protocol import Finish, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from plugins.testing.grammar import grammar_problems

USAGE = Usage(prompt_tokens=3, completion_tokens=2)


def test_a_well_formed_stream_of_two_choices_with_reasoning_and_a_tool_call() -> None:
    events = [
        ReasoningDelta(text="thinking", index=0), TextDelta(text="Hi", index=0),
        ToolCallDelta(tool_index=0, id="call_1", name="f", arguments='{"a":', index=1),
        ToolCallDelta(tool_index=0, arguments=" 1}", index=1),
        Finish(reason="stop", index=0), Finish(reason="tool_calls", index=1), USAGE,
    ]
    assert grammar_problems(events, 2) == []


@pytest.mark.parametrize(("events", "n", "problem"), [
    ([TextDelta(text="a"), USAGE, Finish(reason="stop")], 1, "comes after the Usage"),
    ([TextDelta(text="a"), Finish(reason="stop"), Finish(reason="stop"), USAGE], 1, "2 Finish events"),
    ([TextDelta(text="a"), USAGE], 1, "0 Finish events"),
    ([Finish(reason="stop"), USAGE, USAGE], 1, "2 Usage events"),
    ([Finish(reason="stop")], 1, "0 Usage events"),
    ([Finish(reason="stop"), ReasoningDelta(text="late"), USAGE], 1, "ReasoningDelta) for choice 0 comes after its Finish"),
    ([Finish(reason="stop"), TextDelta(text="late"), USAGE], 1, "TextDelta) for choice 0 comes after its Finish"),
    ([Finish(reason="done"), USAGE], 1, "finishes with 'done'"),  # type: ignore[arg-type]
    ([Finish(reason="tool_calls"), USAGE], 1, "made no tool call"),
    ([Finish(reason="length", stop_sequence="x"), USAGE], 1, "names stop_sequence 'x' but finishes with 'length'"),
    ([TextDelta(text="a", index=1), Finish(reason="stop"), USAGE], 1, "asked for n=1"),
    ([TextDelta(text=""), Finish(reason="stop"), USAGE], 1, "empty TextDelta"),
    ([ReasoningDelta(text=""), Finish(reason="stop"), USAGE], 1, "empty ReasoningDelta"),
    ([ReasoningDelta(text="why", index=1), Finish(reason="stop"), USAGE], 1, "asked for n=1"),
    ([ToolCallDelta(tool_index=0, arguments="{}"), Finish(reason="tool_calls"), USAGE], 1, "lacks an id"),
    ([ToolCallDelta(tool_index=0, id="c", name="f", arguments="{"), Finish(reason="tool_calls"), USAGE], 1, "not JSON"),
    (["text"], 1, "not a protocol event"),
])
def test_each_rule(events: list, n: int, problem: str) -> None:
    problems = grammar_problems(events, n)
    assert any(problem in p for p in problems), problems


def test_a_tool_call_cut_by_max_tokens_may_be_unfinished_json() -> None:
    events = [ToolCallDelta(tool_index=0, id="c", name="f", arguments='{"city": "Par'), Finish(reason="length"), USAGE]
    assert grammar_problems(events, 1) == []
