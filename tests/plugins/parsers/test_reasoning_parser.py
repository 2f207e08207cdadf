"""The `<think>` parser reads the same reasoning and answer however the text is split into deltas."""

from __future__ import annotations

import pytest

from plugins.contract.protocol import Finish, ReasoningDelta, TextDelta, Usage
from plugins.parsers.reasoning import ReasoningSplitter, ThinkTagParser, choose_parser


def _split_all_ways(text: str, in_reasoning: bool) -> set[tuple[str, str]]:
    results = set()
    for cut1 in range(len(text) + 1):
        for cut2 in range(cut1, len(text) + 1):
            parser = ThinkTagParser(in_reasoning=in_reasoning)
            reasoning, answer = "", ""
            for piece in (text[:cut1], text[cut1:cut2], text[cut2:]):
                r, a = parser.feed(piece)
                reasoning, answer = reasoning + r, answer + a
            r, a = parser.finish()
            results.add((reasoning + r, answer + a))
    return results


@pytest.mark.parametrize(("text", "in_reasoning", "expected"), [
    ("<think>plan</think>answer", False, ("plan", "answer")),
    ("  <think>plan</think>answer", False, ("plan", "answer")),
    ("plan</think>answer", True, ("plan", "answer")),
    ("<think>plan</think>answer", True, ("plan", "answer")),
    ("no tags at all", False, ("", "no tags at all")),
    ("all thinking, never closed", True, ("all thinking, never closed", "")),
    ("a </thin k> b", True, ("a </thin k> b", "")),
    ("x <think> y", False, ("", "x <think> y")),
])
def test_every_split_gives_the_same_result(text: str, in_reasoning: bool, expected: tuple[str, str]) -> None:
    assert _split_all_ways(text, in_reasoning) == {expected}


def test_splitter_events_and_reasoning_tokens() -> None:
    splitter = ReasoningSplitter(lambda: ThinkTagParser(in_reasoning=True))
    out = []
    for i, text in enumerate(["think", "ing</th", "ink>Hi", " there"]):
        out += splitter.feed(TextDelta(text=text, token_ids=(i,)))
    out += splitter.feed(Finish(reason="stop"))
    out += splitter.feed(Usage(prompt_tokens=5, completion_tokens=4))
    assert "".join(e.text for e in out if isinstance(e, ReasoningDelta)) == "thinking"
    assert "".join(e.text for e in out if isinstance(e, TextDelta)) == "Hi there"
    assert isinstance(out[-2], Finish) and out[-1] == Usage(prompt_tokens=5, completion_tokens=4, reasoning_tokens=3)


def test_choose_parser() -> None:
    assert choose_parser("none", template_source="<think>", prompt_text=None) is None
    assert choose_parser("auto", template_source="plain {{ m }}", prompt_text=None) is None
    assert choose_parser("auto", template_source="{{ '<think>' }}", prompt_text="x<think>\n")().in_reasoning  # type: ignore[misc]
    assert not choose_parser("auto", template_source="{{ '<think>' }}", prompt_text="x")().in_reasoning  # type: ignore[misc]
    assert choose_parser("deepseek_r1", template_source=None, prompt_text=None)().in_reasoning  # type: ignore[misc]
    assert choose_parser("deepseek_r1", template_source=None, prompt_text=None,
                         chat_template_kwargs={"enable_thinking": False}) is None
