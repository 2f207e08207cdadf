"""What coding agents send to /v1/responses, through a real gateway process with the scripted test
backend (`CALLJSON`, `THINK`: tests/support/script_backend.py), driven by the official `openai`
client, the OpenAI Agents SDK and raw HTTP: namespace and custom tools and their calls, sealed
reasoning read back, hosted tools dropped or refused, every SDK field accepted, ignored or
refused, and a prompt too long in the shape Codex acts on."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.probes import wait_until
from tests.support.server import running_server

MODEL = "script-1"
CODE_TOOLS = {"type": "namespace", "name": "functions", "description": "Code mode.", "tools": [
    {"type": "custom", "name": "exec", "description": "Run JavaScript.",
     "format": {"type": "grammar", "syntax": "lark", "definition": "start: /[\\s\\S]+/"}},
    {"type": "function", "name": "wait", "parameters": {"type": "object", "properties": {"cell_id": {"type": "string"}}}},
]}
WEATHER = {"type": "function", "name": "get_weather", "strict": False,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
HOSTED = [{"type": "web_search", "external_web_access": False}, {"type": "file_search", "vector_store_ids": ["vs_1"]}]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("agents-contract")
    config = f"""
[server]
request_log = "{tmp}/requests.jsonl"
log_prompts = true

[responses]
sqlite_path = "{tmp}/responses.sqlite3"
reasoning_key_file = "{tmp}/reasoning.key"

[plugins]
disable = ["builtin"]
modules = ["tests.support.script_backend"]

[[backends]]
name = "script"
type = "script"
[backends.options]
models = ["{MODEL}", "strict-1"]
max_model_len = 64

[[routes]]
name = "strict-1"
hosted_tools = "reject"
[[routes.targets]]
backend = "script"
"""
    with running_server(config, tmp) as base:
        yield base, tmp / "requests.jsonl"


@pytest.fixture(scope="module")
def client(served: tuple[str, Path]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=served[0] + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def prompt_of(log: Path, marker: str) -> list[dict]:
    """The chat messages of the logged request whose last message holds `marker`."""
    def found() -> list[dict]:
        entries = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return [e["prompt"] for e in entries if marker in json.dumps(e["prompt"][-1])]

    assert wait_until(lambda: bool(found()), timeout=10), marker
    return found()[-1]


def metric(base: str, name: str, **labels: str) -> float:
    text = httpx.get(base + "/metrics", timeout=10).text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if match and ",".join(sorted(match[1].split(","))) == want:
            return float(match[2])
    return 0.0


def test_custom_tool_in_a_namespace_called_and_answered(client: openai.OpenAI) -> None:
    code = 'text(await tools.exec_command({cmd: \\"ls\\"}));'
    first = client.responses.create(model=MODEL, tools=[CODE_TOOLS], store=False,
                                    input=f'CALLJSON functions__exec {{"input": "{code}"}}')
    (call,) = first.output
    assert call.type == "custom_tool_call" and (call.namespace, call.name) == ("functions", "exec")
    assert call.input == code.replace('\\"', '"') and call.status == "completed"
    assert first.tools[0].type == "namespace"  # echoed as sent
    follow = client.responses.create(model=MODEL, tools=[CODE_TOOLS], store=False, input=[
        {"role": "user", "content": "run it"},
        {"type": "custom_tool_call", "call_id": call.call_id, "name": "exec", "namespace": "functions", "input": call.input},
        {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "a.txt b.txt"},
    ])
    assert follow.output_text == "result: a.txt b.txt"


def test_custom_tool_call_streamed(client: openai.OpenAI) -> None:
    with client.responses.stream(model=MODEL, tools=[CODE_TOOLS], input='CALLJSON functions__exec {"input": "exit()"}') as stream:
        events = list(stream)
        final = stream.get_final_response()
    names = [e.type for e in events]
    assert names[2:6] == ["response.output_item.added", "response.custom_tool_call_input.delta",
                          "response.custom_tool_call_input.done", "response.output_item.done"]
    assert "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta") == "exit()"
    (call,) = final.output
    assert call.type == "custom_tool_call" and call.input == "exit()" and call.namespace == "functions"


def test_namespaced_function_call(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, tools=[CODE_TOOLS, WEATHER],
                                       input='CALLJSON functions__wait {"cell_id": "7"}')
    (call,) = response.output
    assert call.type == "function_call" and (call.namespace, call.name, call.arguments) == ("functions", "wait",
                                                                                         '{"cell_id": "7"}')


def test_sealed_reasoning_goes_back_to_the_model(client: openai.OpenAI, served: tuple[str, Path]) -> None:
    first = client.responses.create(model=MODEL, tools=[WEATHER], store=False, include=["reasoning.encrypted_content"],
                                    input="THINK the user wants weather ANSWER CALL get_weather Paris")
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "the user wants weather"
    assert reasoning.encrypted_content and "weather" not in reasoning.encrypted_content
    # resent as Codex does: the sealed text only
    resent = {"type": "reasoning", "id": reasoning.id, "summary": [], "encrypted_content": reasoning.encrypted_content}
    turn = [{"role": "user", "content": "weather in Paris?"}, resent,
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny sealed"}]
    assert client.responses.create(model=MODEL, tools=[WEATHER], input=turn).output_text == "result: sunny sealed"
    assistant = prompt_of(served[1], "sunny sealed")[-2]
    assert assistant["reasoning_content"] == "the user wants weather" and assistant["tool_calls"][0]["id"] == call.call_id
    # another gateway's (or OpenAI's) seal is not ours: left out
    turn[1] = {**resent, "encrypted_content": "gAAAAB-from-elsewhere"}
    turn[3] = {**turn[3], "output": "sunny foreign"}
    client.responses.create(model=MODEL, tools=[WEATHER], input=turn)
    assert "reasoning_content" not in prompt_of(served[1], "sunny foreign")[-2]
    # without `include` no seal is made
    plain = client.responses.create(model=MODEL, input="THINK hmm ANSWER ok")
    assert plain.output[0].encrypted_content is None


def test_the_agents_sdk_runs_a_tool_with_stateless_reasoning(served: tuple[str, Path]) -> None:
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    async def run() -> Any:
        # closed in the loop that opened it: left to the garbage collector, its pool would be
        # closed from a later test's event loop, after this one is gone
        async with AsyncOpenAI(base_url=served[0] + "/v1", api_key="unused") as openai_client:
            model = agents.OpenAIResponsesModel(model=MODEL, openai_client=openai_client)
            settings = agents.ModelSettings(store=False, response_include=["reasoning.encrypted_content"])
            agent = agents.Agent(name="weather", instructions="Use the tool.", tools=[get_weather], model=model,
                                 model_settings=settings)
            return await agents.Runner.run(agent, "THINK plan a call ANSWER CALL get_weather Lyon", max_turns=3)

    result = asyncio.run(run())
    assert result.final_output == "result: sunny in Lyon"
    assistant = prompt_of(served[1], "sunny in Lyon")[-2]
    assert assistant["reasoning_content"] == "plan a call"


def test_hosted_tools_dropped_and_named_or_refused(client: openai.OpenAI, served: tuple[str, Path]) -> None:
    base = served[0]
    before = metric(base, "switchyard_dropped_tools_total", api="responses", tool="web_search")
    raw = client.responses.with_raw_response.create(model=MODEL, input="hello there", tools=[*HOSTED, WEATHER])
    assert raw.headers["x-switchyard-dropped-tools"] == "web_search, file_search"
    response = raw.parse()
    assert response.output_text == "hello there" and [t.type for t in response.tools] == ["function"]
    assert metric(base, "switchyard_dropped_tools_total", api="responses", tool="web_search") == before + 1
    with httpx.stream("POST", base + "/v1/responses", timeout=30,
                      json={"model": MODEL, "input": "hi", "stream": True, "tools": HOSTED}) as stream:
        assert stream.status_code == 200 and stream.headers["x-switchyard-dropped-tools"] == "web_search, file_search"
    assert "x-switchyard-dropped-tools" not in client.responses.with_raw_response.create(model=MODEL, input="hi").headers
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="strict-1", input="hi", tools=[WEATHER, *HOSTED])
    assert info.value.body["param"] == "tools[1].type" and "web_search" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input="hi", tools=HOSTED, tool_choice={"type": "file_search"})
    assert info.value.body["param"] == "tool_choice"


def test_every_field_codex_and_the_sdk_send_is_taken_or_refused_by_name(client: openai.OpenAI,
                                                                       served: tuple[str, Path]) -> None:
    base = served[0]
    before = metric(base, "switchyard_ignored_fields_total", api="responses", field="client_metadata")
    response = client.responses.create(
        model=MODEL, input="fine", store=False, parallel_tool_calls=False, prompt_cache_key="session-1",
        include=["reasoning.encrypted_content"], reasoning={"summary": "auto", "context": "all_turns", "effort": "low"},
        text={"verbosity": "low"}, service_tier="auto", safety_identifier="u1", prompt_cache_retention="24h",
        max_tool_calls=3, background=False, truncation="disabled",
        extra_body={"client_metadata": {"session_id": "session-1", "x-codex-turn-metadata": "{\"a\": 1}"},
                    "context_management": [{"type": "compaction", "compact_threshold": 1000}],
                    "prompt_cache_options": {"ttl": "30m"}, "access_programs": {"cyber": "standard"},
                    "image": {"context_compression": "auto"}, "background_options": {"completion_window": "soonest"}})
    assert response.output_text == "fine" and response.store is False
    assert (response.reasoning.summary, response.text.verbosity) == ("auto", "low")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)  # store: false keeps nothing
    assert metric(base, "switchyard_ignored_fields_total", api="responses", field="client_metadata") == before + 1
    for field, value in [("conversation", "conv_1"), ("prompt", {"id": "pmpt_1"}), ("moderation", {"model": "omni"})]:
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model=MODEL, input="x", extra_body={field: value})
        assert info.value.body["param"] == field and "not supported" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input="x", extra_body={"client_metadta": {}})
    assert info.value.body["param"] == "client_metadta"  # a typo is still a 400 naming it


def test_a_prompt_too_long_is_context_length_exceeded(client: openai.OpenAI, served: tuple[str, Path]) -> None:
    long = " ".join(["word"] * 80)  # the backend's context is 64
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input=long)
    error = info.value.body
    assert (error["code"], error["param"], error["type"]) == ("context_length_exceeded", "input", "invalid_request_error")
    # streamed: the overflow is known before the stream begins, so it is the same 400 (Codex acts on
    # it as on a `response.failed` with that code)
    response = httpx.post(served[0] + "/v1/responses", json={"model": MODEL, "input": long, "stream": True}, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
