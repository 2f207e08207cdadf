"""Tool-call parsers (`plugins.parsers.tools`) on model outputs in the Hermes and Llama 3
formats, whole and streamed in pieces of every size: both must give the same calls and content,
each call's id and name in its first fragment only.

The samples are WRITTEN BY HAND to look like what such models emit (realistic samples, not
captured from a model): Hermes-2-Pro / Qwen2.5-style `<tool_call>` blocks, Llama 3.1-style JSON
calls with and without `<|python_tag|>`."""

from __future__ import annotations

import json
import random

import pytest

from plugins.parsers.tools import (
    HermesParser,
    Llama3JsonParser,
    NamedCallParser,
    RequiredCallsParser,
    ToolCallPiece,
    ToolParser,
    detect_parser,
    make_parser,
    required_calls_schema,
)

# ---- realistic samples (hand-written) -----------------------------------------------------------

HERMES_SAMPLES = [
    (  # Qwen2.5-Instruct style: one call, nothing else
        '<tool_call>\n{"name": "get_current_weather", "arguments": {"location": "San Francisco, CA", "unit": "celsius"}}\n</tool_call>',
        "", [("get_current_weather", {"location": "San Francisco, CA", "unit": "celsius"})],
    ),
    (  # Hermes-2-Pro style: content first, then two parallel calls
        "Sure! Let me look up both cities for you.\n"
        '<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_weather"}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Hà Nội"}}\n</tool_call>',
        "Sure! Let me look up both cities for you.\n",
        [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Hà Nội"})],
    ),
    (  # braces, brackets, escaped quotes and a fake closing tag inside string arguments
        '<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT \\"}\\" AS x, \'</tool_call>\' FROM t WHERE a IN [1, 2]", '
        '"params": [{"k": "{"}, null, 3.5e-2]}}\n</tool_call>',
        "", [("run_sql", {"query": "SELECT \"}\" AS x, '</tool_call>' FROM t WHERE a IN [1, 2]",
                          "params": [{"k": "{"}, None, 3.5e-2]})],
    ),
    (  # no arguments at all, compact JSON
        '<tool_call>{"name":"list_files","arguments":{}}</tool_call>', "", [("list_files", {})],
    ),
    (  # a reply that only mentions the tag in prose is content
        "To call a tool I would write <tool and then the JSON.", "To call a tool I would write <tool and then the JSON.", [],
    ),
    (  # a block that is not JSON stays content, as the model wrote it
        "<tool_call>\nget_weather(city='Paris')\n</tool_call>", "<tool_call>\nget_weather(city='Paris')\n</tool_call>", [],
    ),
]

LLAMA3_SAMPLES = [
    (  # Llama 3.1 with the python tag (kept in the text when special tokens are not skipped)
        '<|python_tag|>{"name": "get_current_conditions", "parameters": {"location": "San Francisco, CA", "unit": "Fahrenheit"}}',
        "", [("get_current_conditions", {"location": "San Francisco, CA", "unit": "Fahrenheit"})],
    ),
    (  # without the tag (skip_special_tokens), two calls separated by ";"
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {"tz": "Europe/Paris"}}',
        "", [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})],
    ),
    (  # "arguments" instead of "parameters", and nested values
        '{"name": "book", "arguments": {"guests": [{"name": "Ana", "age": 31}], "notes": "window seat; {quiet}"}}',
        "", [("book", {"guests": [{"name": "Ana", "age": 31}], "notes": "window seat; {quiet}"})],
    ),
    (  # a plain answer is content
        "The weather in Paris is sunny, 21°C.", "The weather in Paris is sunny, 21°C.", [],
    ),
    (  # JSON that is no call stays content
        '{"temperature": 21, "sky": "clear"}', '{"temperature": 21, "sky": "clear"}', [],
    ),
]


def _chunks(text: str, mode: int | str) -> list[str]:
    if mode == "whole":
        return [text]
    if isinstance(mode, int):
        return [text[i:i + mode] for i in range(0, len(text), mode)]
    rnd = random.Random(mode)
    out, i = [], 0
    while i < len(text):
        n = rnd.randint(1, 6)
        out.append(text[i:i + n])
        i += n
    return out


def parse(parser: ToolParser, pieces: list[str]) -> tuple[str, list[tuple[str, str]], list[ToolCallPiece]]:
    out = []
    for piece in pieces:
        out += parser.feed(piece)
    out += parser.finish()
    content = "".join(p for p in out if isinstance(p, str))
    frags = [p for p in out if isinstance(p, ToolCallPiece)]
    calls: dict[int, list[str]] = {}
    names: dict[int, str] = {}
    for f in frags:
        if f.id is not None:
            assert f.tool_index not in names, "a second header for one call"
            assert f.name and f.id.startswith("call_")
            names[f.tool_index] = f.name
        else:
            assert f.tool_index in names and f.name is None, "arguments before the call's header"
        calls.setdefault(f.tool_index, []).append(f.arguments)
    assert sorted(calls) == list(range(len(calls)))
    return content, [(names[i], "".join(calls[i])) for i in sorted(calls)], frags


MODES = ["whole", 1, 2, 3, 5, 7, "r1", "r2", "r3"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("text,content,calls", HERMES_SAMPLES, ids=[f"hermes{i}" for i in range(len(HERMES_SAMPLES))])
def test_hermes(text: str, content: str, calls: list, mode: int | str) -> None:
    parser = HermesParser()
    got_content, got_calls, _ = parse(parser, _chunks(text, mode))
    assert got_content == content
    assert [(name, json.loads(args)) for name, args in got_calls] == calls
    assert parser.num_calls == len(calls)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("text,content,calls", LLAMA3_SAMPLES, ids=[f"llama3_{i}" for i in range(len(LLAMA3_SAMPLES))])
def test_llama3_json(text: str, content: str, calls: list, mode: int | str) -> None:
    parser = Llama3JsonParser()
    got_content, got_calls, _ = parse(parser, _chunks(text, mode))
    assert got_content == content
    assert [(name, json.loads(args)) for name, args in got_calls] == calls
    assert parser.num_calls == len(calls)


def test_arguments_stream_before_the_call_ends() -> None:
    """Name-first calls: the header goes out as soon as it is complete, then argument pieces."""
    parser = HermesParser()
    assert parser.feed("<tool_call>\n") == []
    assert parser.feed('{"name": "get_wea') == []
    head = parser.feed('ther", "arguments": {"ci')
    assert head[0] == ToolCallPiece(0, "", head[0].id, "get_weather") and head[1:] == [ToolCallPiece(0, '{"ci')]
    assert parser.feed('ty": "Paris"}') == [ToolCallPiece(0, 'ty": "Paris"}')]
    assert parser.feed("}\n</tool_call>") == []
    assert parser.finish() == [] and parser.num_calls == 1


def test_content_that_may_start_a_tag_is_held_back() -> None:
    parser = HermesParser()
    assert parser.feed("Hello <tool") == ["Hello "]
    assert parser.feed("box> ok") == ["<toolbox> ok"]
    assert parser.feed(" <") == [" "]
    assert parser.finish() == ["<"]


def test_a_call_cut_off_by_max_tokens_ends_as_it_is() -> None:
    parser = HermesParser()
    pieces = parser.feed('<tool_call>\n{"name": "f", "arguments": {"a": "unfini')
    pieces += parser.finish()
    assert [p.name for p in pieces if isinstance(p, ToolCallPiece) and p.id] == ["f"]
    assert "".join(p.arguments for p in pieces if isinstance(p, ToolCallPiece)) == '{"a": "unfini'
    assert parser.num_calls == 1


def test_constrained_forms() -> None:
    named = NamedCallParser("get_weather")
    content, calls, frags = parse(named, _chunks('{"city": "Paris"}', 3))
    assert content == "" and calls == [("get_weather", '{"city": "Paris"}')] and frags[0].arguments == ""
    empty = NamedCallParser("f")
    assert parse(empty, [])[1] == [("f", "")]  # the call is there even when nothing was generated
    required = RequiredCallsParser()
    text = '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]'
    assert parse(required, _chunks(text, 2))[1] == [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]
    assert required.num_calls == 2


def test_required_schema_and_parser_choice() -> None:
    tools = [{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "b"}}]
    schema = required_calls_schema(tools, parallel=False)
    assert schema["minItems"] == 1 and schema["maxItems"] == 1
    assert [v["properties"]["name"]["enum"] for v in schema["items"]["anyOf"]] == [["a"], ["b"]]
    assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {"type": "object", "properties": {}}
    assert detect_parser("{% if tools %}<tool_call>{% endif %}") == "hermes"
    assert detect_parser("<|start_header_id|>ipython<|end_header_id|>") == "llama3_json"
    assert detect_parser(None) == "hermes"
    assert isinstance(make_parser("llama3_json"), Llama3JsonParser)
    with pytest.raises(ValueError, match="mistral"):
        make_parser("mistral")
