"""The Responses API and reasoning end to end on the real default model through the built-in
engine: the official `openai` client, and the OpenAI Agents SDK running an agent with a tool."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from tests.support.server import running_server

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"], "additionalProperties": False}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
# the ChatML template of the default model with a generation prompt that opens the thinking
THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


def _config(store: Path) -> str:
    return f"""
[server]
log_level = "warning"
health_interval_s = 0
max_tokens = 256
default_max_tokens = 48

[responses]
sqlite_path = "{store}/responses.sqlite3"

[[backends]]
name = "builtin"
type = "builtin"
[backends.options]
model = "{MODEL}"
num_threads = 1
max_model_len = 2048
kv_cache_tokens = 8192
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="module")
def base_url(default_model_dir: Path, store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(_config(store), tmp_path_factory.mktemp("e2e-responses")) as base:
        yield base


@pytest.fixture(scope="module")
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=300) as c:
        yield c


def test_text_streamed_and_not(client: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL, input="What is the capital of France?", instructions="You are a concise assistant.",
                  temperature=0, max_output_tokens=20)
    plain = client.responses.create(**kwargs)
    assert "Paris" in plain.output_text and plain.status == "completed"
    assert plain.usage.input_tokens == 27 and plain.usage.output_tokens > 0
    with client.responses.stream(**kwargs) as stream:
        final = stream.get_final_response()
    assert final.output_text == plain.output_text


def test_default_output_cap(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="Write a very long story about trains.", temperature=0)
    assert response.max_output_tokens == 48 and response.usage.output_tokens <= 48


def test_function_tool_round_trip(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[WEATHER], temperature=0,
                                    tool_choice={"type": "function", "name": "get_weather"})
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id and call.status == "completed"
    assert isinstance(json.loads(call.arguments)["city"], str)
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=[WEATHER], temperature=0, max_output_tokens=30,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 degrees."}],
    )
    assert second.status in ("completed", "incomplete") and second.output_text
    # the same turn without the stored conversation: the client sends the call back itself
    third = client.responses.create(
        model=MODEL, tools=[WEATHER], temperature=0, max_output_tokens=30,
        input=[{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 degrees."}],
    )
    assert third.output_text == second.output_text


def test_json_schema_format(client: openai.OpenAI) -> None:
    text = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
    response = client.responses.create(model=MODEL, input="Describe a fictional person.", text=text, temperature=0,
                                       max_output_tokens=80)
    jsonschema.validate(json.loads(response.output_text), PERSON)


def test_previous_response_id_across_a_restart(client: openai.OpenAI, store: Path, tmp_path: Path) -> None:
    first = client.responses.create(model=MODEL, input="My name is Ada.", temperature=0, max_output_tokens=10)
    second = client.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id, temperature=0,
                                     max_output_tokens=10)
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    with running_server(_config(store), tmp_path) as base:
        with openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300) as other:
            again = other.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id,
                                           temperature=0, max_output_tokens=10)
    assert again.usage.input_tokens == second.usage.input_tokens and again.output_text == second.output_text


def test_reasoning_from_a_thinking_template(client: openai.OpenAI) -> None:
    """The template opens `<think>`; a grammar makes the model close it and answer."""
    extra = {"chat_template": THINK_TEMPLATE, "structured_outputs": {"regex": r"[a-z ]{4,30}</think>[A-Za-z ]{2,20}"}}
    messages = [{"role": "user", "content": "Name a color."}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=60, extra_body=extra)
    message = chat.choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    assert reasoning and message.content and "think>" not in message.content + reasoning
    assert 0 < chat.usage.completion_tokens_details.reasoning_tokens < chat.usage.completion_tokens
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=60,
                                                 extra_body=extra, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == reasoning
    assert "".join(d.content or "" for d in deltas) == message.content


def test_continuous_usage_stats(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to five."}], temperature=0, max_tokens=6, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    usages = [c.usage for c in chunks]
    assert all(u is not None for u in usages)
    assert usages[0].completion_tokens == 0 and usages[0].prompt_tokens == usages[-1].prompt_tokens
    completions = [u.completion_tokens for u in usages]
    assert completions == sorted(completions) and completions[-1] == 6


def test_agents_sdk_runs_an_agent_with_a_tool(base_url: str) -> None:
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"Sunny in {city}."

    async def run() -> Any:
        # closed in the loop that opened it, not by the garbage collector in a later test's loop
        async with AsyncOpenAI(base_url=base_url + "/v1", api_key="unused") as openai_client:
            model = agents.OpenAIResponsesModel(model=MODEL, openai_client=openai_client)
            agent = agents.Agent(name="weather", instructions="Answer with the weather tool.", tools=[get_weather],
                                 model=model, tool_use_behavior="stop_on_first_tool",
                                 model_settings=agents.ModelSettings(tool_choice="get_weather", temperature=0))
            return await agents.Runner.run(agent, "What is the weather in Paris?", max_turns=3)

    result = asyncio.run(run())
    assert len(calls) == 1 and result.final_output == f"Sunny in {calls[0]}."
