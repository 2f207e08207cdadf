"""The proxy side of structured outputs and tools, without servers: what goes upstream (vLLM:
as it is; llama.cpp: translated), how upstream tool-call deltas come back (one shape), and which
backend the gateway lets a JSON `response_format` through to.

The upstream chunks below are WRITTEN BY HAND after the shapes vLLM 0.32 and llama.cpp b11434
send (realistic samples, not recordings)."""

from __future__ import annotations

import json
import re

import pytest

from plugins.contract.capabilities import check_capabilities
from plugins.contract.errors import InvalidRequest
from plugins.contract.protocol import Capabilities, Finish, RequestSpec, Sampling, TextDelta, ToolCallDelta
from plugins.proxy.gbnf import regex_grammar
from plugins.proxy.llamacpp import LlamaCppBackend, LlamaCppOptions
from plugins.proxy.normalize import StreamNormalizer
from plugins.proxy.openai_compatible import OpenAICompatibleBackend, OpenAICompatibleOptions
from plugins.proxy.vllm import VLLMBackend, VLLMOptions

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]


def spec(**fields: object) -> RequestSpec:
    base = {"request_id": "r", "kind": "chat", "model": "m", "upstream_model": "m",
            "messages": [{"role": "user", "content": "hi"}], "sampling": Sampling(max_tokens=8)}
    base.update(fields)
    return RequestSpec(**base)  # type: ignore[arg-type]


def chunk(delta: dict | None = None, finish: str | None = None, index: int = 0) -> dict:
    return {"id": "x", "object": "chat.completion.chunk", "choices": [
        {"index": index, "delta": delta or {}, "finish_reason": finish}]}


def calls_of(events: list) -> list[tuple[int, str | None, str | None, str]]:
    return [(e.tool_index, e.id, e.name, e.arguments) for e in events if isinstance(e, ToolCallDelta)]


# ---- upstream tool-call deltas ------------------------------------------------------------------


def test_vllm_style_tool_call_stream() -> None:
    norm = StreamNormalizer(kind="chat", n=1, backend="vllm")
    events = []
    for obj in [
        chunk({"role": "assistant", "content": ""}),
        chunk({"tool_calls": [{"index": 0, "id": "chatcmpl-tool-1f2e", "type": "function",
                               "function": {"name": "get_weather", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "chatcmpl-tool-9a0b", "type": "function",
                               "function": {"name": "get_time", "arguments": "{}"}}]}),
        chunk({}, "tool_calls"),
    ]:
        events += norm.feed(obj)
    assert calls_of(events) == [(0, "chatcmpl-tool-1f2e", "get_weather", ""), (0, None, None, '{"city": '),
                                (0, None, None, '"Paris"}'), (1, "chatcmpl-tool-9a0b", "get_time", "{}")]
    assert not [e for e in events if isinstance(e, TextDelta)]
    assert events[-1] == Finish(reason="tool_calls")


def test_llamacpp_style_repeats_and_missing_ids_are_normalized() -> None:
    norm = StreamNormalizer(kind="chat", n=1, backend="llamacpp")
    events = []
    for obj in [
        chunk({"role": "assistant", "content": None}),
        chunk({"tool_calls": [{"index": 0, "type": "function", "function": {"name": "get_weather", "arguments": '{"ci'}}]}),
        # an upstream that repeats id and name in every delta: only the arguments go on
        chunk({"tool_calls": [{"index": 0, "id": "abc", "type": "function", "function": {"name": "get_weather",
                                                                                          "arguments": 'ty": "Rome"}'}}]}),
        chunk({}, "tool_calls"),
    ]:
        events += norm.feed(obj)
    (first, second) = [e for e in events if isinstance(e, ToolCallDelta)]
    assert first.id and first.id.startswith("call_") and first.name == "get_weather" and first.arguments == '{"ci'
    assert second.id is None and second.name is None and second.arguments == 'ty": "Rome"}'


def test_whole_message_tool_calls_take_their_position_as_index() -> None:
    norm = StreamNormalizer(kind="chat", n=1, backend="b")
    events = norm.feed_response({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": {"tz": "UTC"}}},
        ]}}], "usage": {"prompt_tokens": 3, "completion_tokens": 9}})
    assert calls_of(events) == [(0, "c1", "get_weather", '{"city": "Paris"}'), (1, "c2", "get_time", '{"tz":"UTC"}')]


def test_a_name_that_comes_late_is_sent_once() -> None:
    norm = StreamNormalizer(kind="chat", n=1, backend="b")
    events = norm.feed(chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"arguments": ""}}]}))
    events += norm.feed(chunk({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{}"}}]}))
    events += norm.feed(chunk({"tool_calls": [{"index": 0, "function": {"name": "f"}}]}))
    assert calls_of(events) == [(0, "c1", None, ""), (0, None, "f", "{}")]


# ---- request bodies -----------------------------------------------------------------------------


def test_vllm_passes_everything_through() -> None:
    so = {"json": {"type": "object"}, "disable_any_whitespace": True}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    body = VLLMBackend("v", VLLMOptions(base_url="http://u", tools=True)).build_body(
        spec(structured_outputs=so, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}}))
    assert body["structured_outputs"] == so and body["tools"] == TOOLS
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}
    assert VLLMBackend("v", VLLMOptions(base_url="http://u")).build_body(spec(response_format=rf))["response_format"] == rf


def llamacpp() -> LlamaCppBackend:
    return LlamaCppBackend("l", LlamaCppOptions(base_url="http://u", tools=True))


def test_llamacpp_translation() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert llamacpp().build_body(spec(structured_outputs={"json": schema}))["json_schema"] == schema
    assert llamacpp().build_body(spec(structured_outputs={"grammar": 'root ::= "x"'}))["grammar"] == 'root ::= "x"'
    assert llamacpp().build_body(spec(structured_outputs={"choice": ["a", "b"]}))["grammar"] == 'root ::= "a" | "b"'
    assert llamacpp().build_body(spec(structured_outputs={"regex": "[0-9]{2}"}))["grammar"] == "root ::= [0-9]{2}"
    assert llamacpp().build_body(spec(structured_outputs={"json_object": True}))["response_format"] == {"type": "json_object"}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert llamacpp().build_body(spec(response_format=rf))["response_format"] == rf  # llama-server reads it itself
    # a named or "required" tool_choice is enforced with the tool's schema; the content is read back as calls
    named = spec(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}}, response_format=rf)
    body = llamacpp().build_body(named)
    assert body["json_schema"] == {"type": "object"} and body["tool_choice"] == "none" and body["tools"] == TOOLS
    assert "response_format" not in body
    required = spec(tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert llamacpp().build_body(required)["json_schema"]["maxItems"] == 1
    assert llamacpp().build_body(spec(tools=TOOLS, tool_choice="auto"))["tool_choice"] == "auto"
    assert llamacpp().content_calls(spec(tools=TOOLS, tool_choice="auto")) is None
    norm = StreamNormalizer(kind="chat", n=1, backend="l", content_calls=llamacpp().content_calls(required))
    events = norm.feed(chunk({"content": '[{"name": "get_time", "parameters": '}))
    events += norm.feed(chunk({"content": '{"tz": "UTC"}}]'}, "stop"))
    assert calls_of(events)[0][2] == "get_time" and "".join(c[3] for c in calls_of(events)) == '{"tz": "UTC"}'
    assert events[-1] == Finish(reason="tool_calls") and not [e for e in events if isinstance(e, TextDelta)]
    norm = StreamNormalizer(kind="chat", n=1, backend="l", content_calls=llamacpp().content_calls(named))
    events = norm.feed(chunk({"content": '{"tz": "CET"}'}, "stop"))
    assert [(c[2], c[3]) for c in calls_of(events)] == [("get_time", ""), (None, '{"tz": "CET"}')]
    assert events[-1] == Finish(reason="stop")
    for so, param in [({"structural_tag": "{}"}, "structured_outputs.structural_tag"),
                      ({"choice": ["a"], "whitespace_pattern": " "}, "structured_outputs.whitespace_pattern"),
                      ({"regex": r"(a)\1"}, "structured_outputs.regex")]:
        with pytest.raises(InvalidRequest) as info:
            llamacpp().build_body(spec(structured_outputs=so))
        assert info.value.param == param


REGEXES = [
    (r"[A-Z][a-z]{2,8}-[0-9]{2,4}( (red|green|blue))?", ["Abc-12", "Paris-2024 red", "Abc-12 ", "abc-12", "Ab-12"]),
    (r"\d{3}-\d{4}", ["555-1234", "55-1234", "555-12345"]),
    (r"(yes|no|maybe)", ["yes", "maybe", "yesno", ""]),
    (r"\w+@\w+\.com", ["a_b@c1.com", "a@b.org", "@b.com"]),
    (r"[^\"\n]{1,5}x", ['abx', '"x', "123456x", "x"]),
    (r"^(ab)+c?$", ["ab", "ababc", "abc c", "a"]),
    (r"[\u00e9-\u00ff]+\s?\S*", ["éé", "ÿ x!", "a"]),
    (r'say "\\hi\\"', ['say "\\hi\\"', "say hi"]),
    (r"x*y+z?", ["", "y", "xxyyz", "xz"]),
]


@pytest.mark.parametrize("regex,samples", REGEXES, ids=[r for r, _ in REGEXES])
def test_regex_grammar_accepts_what_the_regex_matches(regex: str, samples: list[str]) -> None:
    """The GBNF a regex becomes for llama.cpp has the same language: checked with xgrammar's
    GBNF reader on strings in and out of it."""
    from xgrammar import Grammar
    from xgrammar.testing import _is_grammar_accept_string

    grammar = Grammar.from_ebnf(regex_grammar(regex))
    for sample in samples:
        assert _is_grammar_accept_string(grammar, sample) == bool(re.fullmatch(regex, sample)), (regex, sample)


# ---- capabilities -------------------------------------------------------------------------------


def test_json_response_format_is_its_own_capability() -> None:
    rf_spec = spec(response_format={"type": "json_object"})
    hosted = OpenAICompatibleBackend("hosted", OpenAICompatibleOptions(base_url="https://api.example"))
    assert "structured_outputs" not in hosted.capabilities().extensions
    check_capabilities(rf_spec, hosted.capabilities(), "hosted")  # not refused
    plain = OpenAICompatibleBackend("plain", OpenAICompatibleOptions(base_url="http://u", response_format=False))
    with pytest.raises(InvalidRequest, match="response_format"):
        check_capabilities(rf_spec, plain.capabilities(), "plain")
    for backend in (llamacpp(), VLLMBackend("v", VLLMOptions(base_url="http://u"))):
        check_capabilities(rf_spec, backend.capabilities(), backend.name)
    with pytest.raises(InvalidRequest, match="structured_outputs"):
        check_capabilities(spec(structured_outputs={"choice": ["a"]}, extensions=frozenset({"structured_outputs"})),
                           hosted.capabilities(), "hosted")
    check_capabilities(spec(response_format={"type": "text"}), Capabilities(), "anything")


def test_json_dumps_of_arguments_objects_is_compact_json() -> None:
    # an upstream that sends arguments as an object: the client still gets JSON text
    norm = StreamNormalizer(kind="chat", n=1, backend="b")
    (event,) = norm.feed(chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": {"a": [1]}}}]}))
    assert json.loads(event.arguments) == {"a": [1]}


# ---- system messages after the first ------------------------------------------------------------

CLAUDE_CODE_TURNS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."},
                     {"role": "system", "content": "# Environment"}]


@pytest.mark.parametrize("backend_type", [VLLMBackend, LlamaCppBackend, OpenAICompatibleBackend])
def test_system_messages_in_place_or_folded(backend_type: type) -> None:
    options = {VLLMBackend: VLLMOptions, LlamaCppBackend: LlamaCppOptions,
               OpenAICompatibleBackend: OpenAICompatibleOptions}[backend_type]
    in_place = backend_type("b", options(base_url="http://u")).build_body(spec(messages=CLAUDE_CODE_TURNS))
    assert in_place["messages"] == CLAUDE_CODE_TURNS
    folded = backend_type("b", options(base_url="http://u", system_messages="fold")).build_body(
        spec(messages=CLAUDE_CODE_TURNS))
    assert folded["messages"] == [{"role": "system", "content": "Be brief.\n\n# Environment"},
                                  {"role": "user", "content": "Name a colour."}]
