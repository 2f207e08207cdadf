"""Structured outputs through the gateway against the real vLLM and llama.cpp servers (the
session fixtures of this folder): the same choice, regex and JSON-schema requests the built-in
engine is tested with (`tests/plugins/builtin/test_constrained.py`) must validate on each
engine, streamed and not."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import openai
import pytest

from tests.e2e.real_engines.conftest import public_name

ASK_JSON = [{"role": "system", "content": "You answer in JSON."},
            {"role": "user", "content": "Describe a fictional person: name, age and city."}]
ASK_CHOICE = [{"role": "user", "content": "Is Paris the capital of France? Answer yes or no."}]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "city": {"type": "string", "maxLength": 20}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
CHOICES = ["yes", "no", "maybe"]
REGEX = r"[A-Z][a-z]{1,10}, [0-9]{1,3}"


@pytest.fixture(scope="module")
def client(gateway_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key="unused", max_retries=0, timeout=180)


def ask(client: openai.OpenAI, engine: str, stream: bool, **kwargs: Any) -> tuple[str, str]:
    kwargs = {"model": public_name(engine), "temperature": 0, "max_tokens": 120, **kwargs}
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        return choice.message.content, choice.finish_reason
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), finishes[0]


@pytest.mark.parametrize("stream", [False, True])
def test_choice(client: openai.OpenAI, engine: str, stream: bool) -> None:
    for temperature in (0, 1.0):
        text, finish = ask(client, engine, stream, messages=ASK_CHOICE, temperature=temperature, seed=1,
                           extra_body={"structured_outputs": {"choice": CHOICES}})
        assert text in CHOICES and finish == "stop", text


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema(client: openai.OpenAI, engine: str, stream: bool) -> None:
    text, finish = ask(client, engine, stream, messages=ASK_JSON, extra_body={"structured_outputs": {"json": PERSON}})
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), PERSON)
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    text, finish = ask(client, engine, stream, messages=ASK_JSON, response_format=rf)
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), PERSON)


def test_regex(client: openai.OpenAI, engine: str) -> None:
    """vLLM takes the regex; llama.cpp gets it as an equivalent GBNF grammar."""
    text, finish = ask(client, engine, False, messages=ASK_JSON, extra_body={"structured_outputs": {"regex": REGEX}})
    assert finish == "stop" and re.fullmatch(REGEX, text), text


@pytest.mark.parametrize("stream", [False, True])
def test_invalid_schema_is_400(client: openai.OpenAI, engine: str, stream: bool) -> None:
    """vLLM reports it inside a 200 event stream when streaming; the client still gets a 400."""
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, engine, stream, messages=ASK_JSON, extra_body={"structured_outputs": {"json": {"type": "nonsense"}}})
    assert info.value.status_code == 400 and "nonsense" in info.value.message


# ---- tools on a llama-server started with --jinja (starts in about a second) ----------------------

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
                                           "parameters": WEATHER}}]
ASK_TOOL = [{"role": "user", "content": "What is the weather in Paris? Use the get_weather tool."}]


@pytest.fixture(scope="module")
def jinja_client(engine_servers: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engines.launch import start_llamacpp
    from tests.support.server import running_server

    if "llamacpp" not in engine_servers:
        pytest.skip("llama.cpp is not installed")
    logs = tmp_path_factory.mktemp("llamacpp-jinja")
    server = start_llamacpp(alias="smollm2-135m-instruct", ctx_size=2048, parallel=1, threads=1, log_dir=logs,
                            extra=["--jinja"])
    config = "\n".join(['[plugins]', 'disable = ["builtin"]', "", "[[backends]]", 'name = "llamacpp"',
                        'type = "llamacpp"', "[backends.options]", f'base_url = "{server.base_url}"', "tools = true", ""])
    try:
        with running_server(config, logs) as base:
            yield openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    finally:
        server.stop()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool_choice", ["named", "required"])
def test_llamacpp_enforced_tool_choice(jinja_client: openai.OpenAI, tool_choice: str, stream: bool) -> None:
    """llama-server takes no named tool_choice, and "required" only for templates it knows: the
    proxy enforces both with the tool's schema and reads the content back as tool calls."""
    choice: Any = {"type": "function", "function": {"name": "get_weather"}} if tool_choice == "named" else "required"
    kwargs = dict(model="smollm2-135m-instruct", messages=ASK_TOOL, tools=TOOLS, tool_choice=choice, temperature=0,
                  max_tokens=80, parallel_tool_calls=False)
    if stream:
        chunks = list(jinja_client.chat.completions.create(stream=True, **kwargs))
        deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
        assert deltas[0].id and deltas[0].type == "function" and deltas[0].function.name == "get_weather"
        assert all(d.id is None and d.function.name is None for d in deltas[1:])
        name, arguments = deltas[0].function.name, "".join(d.function.arguments or "" for d in deltas)
        finish = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
    else:
        resp = jinja_client.chat.completions.create(**kwargs).choices[0]
        (call,) = resp.message.tool_calls
        name, arguments, finish = call.function.name, call.function.arguments, resp.finish_reason
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments), WEATHER)
    assert finish == ("stop" if tool_choice == "named" else "tool_calls")
