"""Structured outputs and tool calls end to end: a real gateway over the built-in engine (tiny
random-weight model), read with the official `openai` client, streamed and not."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.plugins.builtin.conftest import _one_torch_thread, client, gateway  # noqa: F401 - fixtures
from tests.plugins.builtin.test_constrained import CHOICES, ORDER, PERSON, REGEX

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"]}}},
]
PARAMS = {"get_weather": WEATHER, "get_time": TOOLS[1]["function"]["parameters"]}


def streamed(client: openai.OpenAI, **kwargs: Any) -> tuple[str, str, list[Any]]:
    """(content, finish_reason, chunks) of a streamed chat completion."""
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1, finishes
    return content, finishes[0], chunks


@pytest.mark.parametrize("stream", [False, True])
def test_choice_regex_and_schemas(client: openai.OpenAI, stream: bool) -> None:
    cases = [
        ({"choice": CHOICES}, lambda text: text in CHOICES),
        ({"regex": REGEX}, lambda text: re.fullmatch(REGEX, text) is not None),
        ({"json": PERSON}, lambda text: jsonschema.validate(json.loads(text), PERSON) is None),
        ({"json": ORDER}, lambda text: jsonschema.validate(json.loads(text), ORDER) is None),
    ]
    for structured, valid in cases:
        for seed in range(4):
            kwargs = dict(model="tiny", messages=MESSAGES, max_tokens=200, temperature=1.0, seed=seed,
                          extra_body={"structured_outputs": structured})
            if stream:
                text, finish, _ = streamed(client, **kwargs)
            else:
                choice = client.chat.completions.create(**kwargs).choices[0]
                text, finish = choice.message.content, choice.finish_reason
            assert finish == "stop" and valid(text), (structured, text)


@pytest.mark.parametrize("stream", [False, True])
def test_response_format(client: openai.OpenAI, stream: bool) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    kwargs = dict(model="tiny", messages=MESSAGES, max_tokens=200, seed=3, response_format=rf)
    if stream:
        text, finish, _ = streamed(client, **kwargs)
    else:
        choice = client.chat.completions.create(**kwargs).choices[0]
        text, finish = choice.message.content, choice.finish_reason
    assert finish == "stop"
    jsonschema.validate(json.loads(text), PERSON)
    found = [client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=100, seed=seed,
                                            response_format={"type": "json_object"}).choices[0] for seed in range(6)]
    assert all(c.message.content.startswith("{") for c in found)
    assert all(isinstance(json.loads(c.message.content), dict) for c in found if c.finish_reason == "stop")


@pytest.mark.parametrize("stream", [False, True])
def test_invalid_schema_is_400_naming_it(client: openai.OpenAI, stream: bool) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=MESSAGES, stream=stream,
                                       extra_body={"structured_outputs": {"json": {"type": "nonsense"}}})
    assert info.value.status_code == 400
    assert info.value.body["param"] == "structured_outputs.json"
    assert 'Unsupported type "nonsense"' in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=MESSAGES, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": []}}})
    assert info.value.body["param"] == "response_format.json_schema.schema"
    assert "properties must be an object" in info.value.message


# ---- tools ------------------------------------------------------------------------------------


def test_named_tool_choice(client: openai.OpenAI) -> None:
    for seed in range(4):
        resp = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, seed=seed, max_tokens=120,
                                              tool_choice={"type": "function", "function": {"name": "get_weather"}})
        choice = resp.choices[0]
        assert choice.finish_reason == "stop"  # as vLLM: a named call is no "tool_calls" finish
        assert choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_named_tool_choice_streams_openai_deltas(client: openai.OpenAI, gateway: str) -> None:
    _, finish, chunks = streamed(client, model="tiny", messages=MESSAGES, tools=TOOLS, seed=5, max_tokens=120,
                                 tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert finish == "stop"
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    first, rest = deltas[0], deltas[1:]
    assert first.index == 0 and first.id.startswith("call_") and first.type == "function"
    assert first.function.name == "get_time" and first.function.arguments == ""
    assert rest and all(d.index == 0 and d.id is None and d.function.name is None and d.function.arguments
                        for d in rest)
    jsonschema.validate(json.loads("".join(d.function.arguments for d in rest)), PARAMS["get_time"])
    # the raw wire: the first tool-call chunk carries index, id, type and name; the others no more
    body = {"model": "tiny", "messages": MESSAGES, "tools": TOOLS, "seed": 5, "max_tokens": 120, "stream": True,
            "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    with httpx.stream("POST", gateway + "/v1/chat/completions", json=body, timeout=60) as resp:
        raw = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in raw if c["choices"][0]["delta"].get("tool_calls")]
    assert set(calls[0]) == {"index", "id", "type", "function"} and set(calls[0]["function"]) == {"name", "arguments"}
    assert all(set(c) == {"index", "function"} and set(c["function"]) == {"arguments"} for c in calls[1:])


@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_choice(client: openai.OpenAI, stream: bool) -> None:
    kwargs = dict(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                  seed=2, max_tokens=150)
    if stream:
        _, finish, chunks = streamed(client, **kwargs)
        calls: dict[int, dict[str, str]] = {}
        for c in chunks:
            for d in (c.choices[0].delta.tool_calls or ()) if c.choices else ():
                call = calls.setdefault(d.index, {"name": "", "arguments": ""})
                call["name"] += d.function.name or ""
                call["arguments"] += d.function.arguments or ""
        got = [(c["name"], c["arguments"]) for _, c in sorted(calls.items())]
    else:
        choice = client.chat.completions.create(**kwargs).choices[0]
        finish = choice.finish_reason
        got = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert finish == "tool_calls"
    assert len(got) == 1
    name, arguments = got[0]
    jsonschema.validate(json.loads(arguments), PARAMS[name])


HERMES_CALL = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)", "unit": "celsius"\}\}\n</tool_call>'
LLAMA3_CALL = r'\{"name": "get_time", "parameters": \{"tz": "(UTC|CET)"\}\}'


@pytest.mark.parametrize("model,regex,name", [("tiny", HERMES_CALL, "get_weather"), ("tiny-llama3", LLAMA3_CALL, "get_time")],
                         ids=["hermes", "llama3_json"])
@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_choice_parses_the_models_format(client: openai.OpenAI, model: str, regex: str, name: str,
                                                   stream: bool) -> None:
    """tool_choice "auto": the backend's parser reads the model's own call format. A regex makes
    the random model write one, as a trained model would."""
    kwargs = dict(model=model, messages=MESSAGES, tools=TOOLS, tool_choice="auto", seed=1, max_tokens=100,
                  extra_body={"structured_outputs": {"regex": regex}})
    if stream:
        content, finish, chunks = streamed(client, **kwargs)
        deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
        assert deltas[0].function.name == name and deltas[0].id
        arguments = "".join(d.function.arguments or "" for d in deltas)
    else:
        choice = client.chat.completions.create(**kwargs).choices[0]
        content, finish = choice.message.content or "", choice.finish_reason
        (call,) = choice.message.tool_calls
        assert call.function.name == name
        arguments = call.function.arguments
    assert finish == "tool_calls" and content == ""
    jsonschema.validate(json.loads(arguments), PARAMS[name])


def test_auto_without_a_call_is_plain_content(client: openai.OpenAI) -> None:
    choice = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, seed=4, max_tokens=12,
                                            extra_body={"structured_outputs": {"regex": "[a-z ]{4,30}"}}).choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length")
    assert re.fullmatch("[a-z ]{4,30}", choice.message.content)


def test_tool_conversation_and_tool_message_rules(client: openai.OpenAI) -> None:
    turn = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
    ]
    resp = client.chat.completions.create(model="tiny", messages=turn, tools=TOOLS, max_tokens=12, seed=1,
                                          extra_body={"structured_outputs": {"choice": ["Sunny", "Rainy"]}})
    assert resp.choices[0].message.content in ("Sunny", "Rainy")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[*MESSAGES, {"role": "tool", "content": "21"}],
                                       max_tokens=4)
    assert "tool_call_id" in str(info.value.body)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=turn[:2] + [{**turn[2], "tool_call_id": "call_9"}],
                                       max_tokens=4)
    assert info.value.body["param"] == "messages[2].tool_call_id"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                       extra_body={"structured_outputs": {"choice": ["a"]}})
    assert info.value.body["param"] == "structured_outputs"
