"""The Responses API and continuous usage through the proxies, against real llama.cpp and vLLM
serving the default model (the session fixtures of this folder), with the official client."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.e2e.real_engines.conftest import public_name
from tests.e2e.real_engines.test_structured_real import PERSON, WEATHER, jinja_client  # noqa: F401 - a fixture

FRANCE = "What is the capital of France?"


@pytest.fixture(scope="module")
def client(gateway_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key="unused", max_retries=0, timeout=180)


def test_text_created_and_streamed(client: openai.OpenAI, engine: str) -> None:
    kwargs: dict[str, Any] = dict(model=public_name(engine), input=FRANCE, instructions="You are a concise assistant.",
                                  temperature=0, max_output_tokens=24)
    plain = client.responses.create(**kwargs)
    assert "Paris" in plain.output_text and plain.status == "completed"
    assert plain.usage.input_tokens == 27 and plain.usage.total_tokens == plain.usage.input_tokens + plain.usage.output_tokens
    with client.responses.stream(**kwargs) as stream:
        names = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == plain.output_text
    assert names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"] and names[-1] == "response.completed"


def test_previous_response_id(client: openai.OpenAI, engine: str) -> None:
    first = client.responses.create(model=public_name(engine), input="My name is Ada.", temperature=0, max_output_tokens=8)
    second = client.responses.create(model=public_name(engine), input="What is my name?", previous_response_id=first.id,
                                     temperature=0, max_output_tokens=8)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


def test_json_schema(client: openai.OpenAI, engine: str) -> None:
    response = client.responses.create(
        model=public_name(engine), input="Describe a fictional person: name, age and city.", temperature=0,
        max_output_tokens=120, text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}})
    jsonschema.validate(json.loads(response.output_text), PERSON)


def test_tools_need_the_servers_tool_flags(client: openai.OpenAI, engine: str) -> None:
    """The session's servers run without tool calling (vLLM: `--enable-auto-tool-choice
    --tool-call-parser`, llama.cpp: `--jinja`), so their backends are configured without
    `tools = true`: a 400 naming the field and the backend, never the upstream's own words."""
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER}
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=public_name(engine), input="Weather in Paris?", tools=[tool])
    assert info.value.body["param"] == "tools" and engine in info.value.message


def test_function_call_round_trip_on_llamacpp_with_jinja(jinja_client: openai.OpenAI) -> None:  # noqa: F811
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER}
    first = jinja_client.responses.create(model="smollm2-135m-instruct", input="What is the weather in Paris?", tools=[tool],
                                          tool_choice={"type": "function", "name": "get_weather"}, temperature=0,
                                          max_output_tokens=60)
    (call,) = [item for item in first.output if item.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    second = jinja_client.responses.create(
        model="smollm2-135m-instruct", previous_response_id=first.id, tools=[tool], temperature=0, max_output_tokens=30,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 degrees."}])
    assert second.output_text and second.status in ("completed", "incomplete")


def test_continuous_usage_stats(client: openai.OpenAI, engine: str) -> None:
    kwargs: dict[str, Any] = dict(model=public_name(engine), messages=[{"role": "user", "content": FRANCE}], temperature=0,
                                  max_tokens=6, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
    if engine == "llamacpp":
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(**kwargs)
        assert info.value.body["param"] == "continuous_usage_stats"
        return
    chunks = list(client.chat.completions.create(**kwargs))
    usages = [c.usage for c in chunks]
    assert all(u is not None for u in usages), usages
    completions = [u.completion_tokens for u in usages]
    assert completions == sorted(completions) and completions[-1] == 6
    assert {u.prompt_tokens for u in usages} == {usages[-1].prompt_tokens}
