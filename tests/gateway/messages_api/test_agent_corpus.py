"""Every request the real Claude Code sent (tests/recordings/agents/claude-*.json) decodes, passes
the field table and translates into a RequestSpec, and a gateway serves it as it was sent (path,
query, headers, body): adding a newer CLI's recording is the whole upgrade test of the Messages
front-end. What each part of a request becomes is checked against the recorded body itself."""

from __future__ import annotations

import json

import httpx
import msgspec
import pytest
from prometheus_client import CollectorRegistry, Counter

from gateway.messages_api import schemas as M
from gateway.messages_api.fields import MESSAGES_FIELDS
from gateway.messages_api.translate import messages_spec
from tests.gateway.script_server import KEY, Server
from tests.support import agent_recordings
from tests.support.agent_recordings import AgentRequest

CLAUDE = agent_recordings.api_requests("claude")
SKIPPED_HEADERS = {"host", "content-length", "connection", "accept-encoding", "x-api-key"}


def _ids(requests: list[AgentRequest]) -> list[str]:
    return [r.id for r in requests]


def _headers(recorded: AgentRequest) -> dict[str, str]:
    return {key.lower(): value for key, value in recorded.headers}


def _texts(content: str | list[dict]) -> str:
    return content if isinstance(content, str) else "\n".join(b["text"] for b in content if b["type"] == "text")


def test_the_corpus_has_claude_code_requests() -> None:
    assert len(CLAUDE) >= 5 and {r.scenario for r in CLAUDE} >= {"bare", "default", "tool", "resume"}


@pytest.mark.parametrize("recorded", CLAUDE, ids=_ids(CLAUDE))
def test_decodes_and_translates(recorded: AgentRequest) -> None:
    body = recorded.body
    request = msgspec.json.decode(recorded.body_bytes(), type=M.MessagesRequest)
    ignored = Counter("ignored", "", ["api", "field"], registry=CollectorRegistry())
    MESSAGES_FIELDS.screen(request, ignored)  # nothing Claude Code sends is refused
    counted = {sample.labels["field"] for sample in ignored.collect()[0].samples if sample.name.endswith("_total")}
    assert counted == set(body) & set(MESSAGES_FIELDS.ignored)
    spec = messages_spec(request, request_id="r")

    # the session: Claude Code's session id, in the body (and in its header)
    assert spec.session == json.loads(body["metadata"]["user_id"])["session_id"] == _headers(recorded)["x-claude-code-session-id"]
    assert spec.user == body["metadata"]["user_id"] and spec.stream is True
    # the conversation: the system blocks first, every system turn in its place
    system = "\n".join(block["text"] for block in body["system"])
    expected_roles = ["system"]
    for message in body["messages"]:
        content = message["content"]
        results = [b for b in content if b["type"] == "tool_result"] if isinstance(content, list) else []
        expected_roles += ["tool"] * len(results)
        if not results or any(b["type"] == "text" for b in content):
            expected_roles.append(message["role"])
    assert [m["role"] for m in spec.messages] == expected_roles
    assert spec.messages[0] == {"role": "system", "content": system}
    turns = [m for m in spec.messages[1:] if m["role"] == "system"]
    assert [t["content"] for t in turns] == [_texts(m["content"]) for m in body["messages"] if m["role"] == "system"]
    assert spec.add_generation_prompt and not spec.continue_final_message
    # tools: the deferred ones wait for a tool search
    offered = [t["name"] for t in body["tools"] if not t.get("defer_loading")]
    assert (spec.tools and [t["function"]["name"] for t in spec.tools]) == (offered or None)
    # adaptive thinking at Claude Code's effort (high or medium): on, where the backend can switch
    assert body["thinking"]["type"] == "adaptive" and body["output_config"]["effort"] != "low"
    assert spec.chat_template_kwargs == {"enable_thinking": True} and "chat_template_kwargs" not in spec.extensions
    assert spec.sampling.max_tokens == body["max_tokens"]


@pytest.mark.parametrize("recorded", CLAUDE, ids=_ids(CLAUDE))
def test_served_as_sent(server: Server, recorded: AgentRequest) -> None:
    """The recorded request, on the recorded path and with the recorded headers, to a backend
    with room for it: a stream that ends with `message_stop` (the scripted backend plays the
    last turn's words back)."""
    body = {**recorded.body, "model": "claude-agent"}
    headers = {k: v for k, v in _headers(recorded).items() if k not in SKIPPED_HEADERS} | {"x-api-key": KEY}
    assert recorded.target == "/v1/messages?beta=true"
    response = httpx.post(server.base + recorded.target, content=json.dumps(body), headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    names = [line[7:] for line in response.text.splitlines() if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"] and "error" not in names
