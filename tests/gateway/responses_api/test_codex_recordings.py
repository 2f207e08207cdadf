"""The corpus: every request the pinned Codex CLI sent (tests/recordings/agents/codex-*) decodes
and translates through the Responses front-end into a `RequestSpec`, nothing refused. Adding a
newer Codex's recordings is the whole upgrade test."""

from __future__ import annotations

import msgspec
import pytest
from prometheus_client import CollectorRegistry, Counter

from gateway.responses_api import schemas as R
from gateway.responses_api import translate
from gateway.responses_api.fields import RESPONSES_FIELDS
from gateway.responses_api.reasoning_seal import ReasoningSeal
from plugins.contract.errors import InvalidRequest
from plugins.contract.protocol import RequestSpec
from tests.support import agent_recordings
from tests.support.agent_recordings import AgentRequest

CODEX = agent_recordings.api_requests("codex")
SEAL = ReasoningSeal(b"s" * 32)


def spec_of(recorded: AgentRequest, hosted: str = "drop") -> tuple[RequestSpec, R.ResponsesRequest, list[str], Counter]:
    req = msgspec.json.decode(recorded.body_bytes(), type=R.ResponsesRequest)
    ignored = Counter("ignored", "", ("api", "field"), registry=CollectorRegistry())
    RESPONSES_FIELDS.screen(req, ignored)
    translate.check_request(req)
    items = translate.input_items(req)
    tools = translate.request_tools(req, items, hosted)
    messages = translate.to_messages(items, set(), seal=SEAL, all_turns=req.reasoning.context == "all_turns")
    spec = translate.to_spec(req, request_id="r1", history=[], turn=messages, tools=tools)
    return spec, req, tools.dropped, ignored


def test_the_corpus_is_there() -> None:
    assert {r.scenario for r in CODEX} == set(agent_recordings.SCENARIOS)


@pytest.mark.parametrize("recorded", CODEX, ids=[r.id for r in CODEX])
def test_every_codex_request_becomes_a_request_spec(recorded: AgentRequest) -> None:
    spec, req, dropped, ignored = spec_of(recorded)
    assert spec.kind == "chat" and spec.stream and spec.model == recorded.body["model"]
    assert spec.session == req.prompt_cache_key == recorded.header("session-id")
    # the system prompt (developer messages, no `instructions`) is one system message, first
    assert spec.messages[0]["role"] == "system" and "Codex" in spec.messages[0]["content"]
    assert [m["role"] for m in spec.messages[1:]].count("system") == 0
    assert spec.messages[-1]["role"] in ("user", "tool")
    assert ignored.labels("responses", "client_metadata")._value.get() == 1
    names = [t["function"]["name"] for t in spec.tools or []]
    assert len(names) == len(set(names)) and all(n.replace("__", "").replace("_", "").isalnum() for n in names)
    msgspec.json.encode(spec)  # what a backend or an upstream gets
    # web_search goes wherever Codex sends it: dropped by default, a 400 naming it on a "reject" route
    if any(isinstance(t, R.HOSTED_TOOLS) for t in req.tools or []):
        assert dropped == ["web_search"]
        with pytest.raises(InvalidRequest) as info:
            spec_of(recorded, hosted="reject")
        web_search = next(i for i, t in enumerate(recorded.body["tools"]) if t["type"] == "web_search")
        assert info.value.param == f"tools[{web_search}].type"


def test_named_model_tools_flatten_the_namespace() -> None:
    (named,) = agent_recordings.load("codex", "model")
    spec, *_ = spec_of(named)
    names = {t["function"]["name"] for t in spec.tools}
    assert {"exec_command", "multi_agent_v1__spawn_agent", "multi_agent_v1__wait_agent"} <= names


def test_code_mode_tools_come_from_the_additional_tools_item() -> None:
    (default,) = agent_recordings.load("codex", "default")
    spec, req, dropped, _ = spec_of(default)
    assert req.tools is None and dropped == []
    by_name = {t["function"]["name"]: t["function"] for t in spec.tools}
    assert {"functions__exec", "functions__wait", "clock__sleep", "collaboration__spawn_agent"} <= set(by_name)
    exec_input = by_name["functions__exec"]["parameters"]["properties"]["input"]
    assert exec_input["type"] == "string" and "lark grammar" in exec_input["description"]


def test_the_tool_round_trip_is_a_call_and_its_output() -> None:
    _, second = agent_recordings.load("codex", "tool")
    spec, *_ = spec_of(second)
    call, output = spec.messages[-2:]
    (tool_call,) = call["tool_calls"]
    assert call["role"] == "assistant" and tool_call["function"]["name"] == "exec_command"
    assert output == {"role": "tool", "tool_call_id": tool_call["id"], "content": second.body["input"][-1]["output"]}


@pytest.mark.parametrize("scenario", ["tool", "resume"])
def test_each_turn_extends_the_last_as_an_exact_prefix(scenario: str) -> None:
    """Codex resends the whole history each turn; the chat messages keep it byte-identical, so an
    engine's prefix cache (and prefix routing) holds from one turn to the next."""
    first, second = agent_recordings.load("codex", scenario)
    before, after = spec_of(first)[0], spec_of(second)[0]
    assert len(after.messages) > len(before.messages)
    assert msgspec.json.encode(after.messages[:len(before.messages)]) == msgspec.json.encode(before.messages)
    assert after.tools == before.tools
