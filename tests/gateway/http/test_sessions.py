"""The agent session a request belongs to: the body's id first, then Claude Code's header, then
Codex's; what the real CLIs sent resolves to the session id they meant; every front-end's request
carries it (the request log shows it)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from gateway.http.sessions import MAX_SESSION_CHARS, SESSION_HEADERS, session_of, with_session
from plugins.contract.protocol import RequestSpec, Sampling
from tests.support import agent_recordings
from tests.support.server import echo_config, running_server


def spec(session: str | None = None) -> RequestSpec:
    return RequestSpec(request_id="r", kind="chat", model="m", upstream_model="m", sampling=Sampling(),
                       messages=[{"role": "user", "content": "hi"}], session=session)


@pytest.mark.parametrize(("body", "headers", "expected"), [
    ("body-id", {"x-claude-code-session-id": "claude-id", "session-id": "codex-id"}, "body-id"),
    (None, {"x-claude-code-session-id": "claude-id", "session-id": "codex-id"}, "claude-id"),
    (None, {"session-id": "codex-id"}, "codex-id"),
    ("", {"session-id": "codex-id"}, "codex-id"),  # an empty body id is no id
    (None, {"x-claude-code-session-id": "  ", "session-id": "codex-id"}, "codex-id"),
    (None, {"thread-id": "t", "x-session-id": "s"}, None),  # only the two CLIs' headers
    (None, {}, None),
    (" padded ", {}, "padded"),
])
def test_precedence(body: str | None, headers: dict[str, str], expected: str | None) -> None:
    assert session_of(body, headers) == expected


def test_an_over_long_value_is_no_session_and_the_next_source_is_used() -> None:
    long = "x" * (MAX_SESSION_CHARS + 1)
    assert session_of(long, {}) is None
    assert session_of(long, {"session-id": "codex-id"}) == "codex-id"
    assert session_of("x" * MAX_SESSION_CHARS, {}) == "x" * MAX_SESSION_CHARS


def test_with_session_copies_only_when_it_changes() -> None:
    plain = spec()
    assert with_session(plain, {}) is plain
    keyed = spec("body-id")
    assert with_session(keyed, {"session-id": "other"}) is keyed
    assert with_session(plain, {"session-id": "codex-id"}).session == "codex-id"


@pytest.mark.parametrize("request_", agent_recordings.api_requests(), ids=lambda r: r.id)
def test_the_recorded_cli_requests_carry_their_session_in_a_header(request_: agent_recordings.AgentRequest) -> None:
    """Both CLIs send the session in a header the gateway reads (whatever the body says), and the
    same id in the body: Codex's `prompt_cache_key`, Claude Code's `metadata.user_id`."""
    headers = {name.lower(): value for name, value in request_.headers}
    session = session_of(None, headers)
    assert session is not None and session in {headers.get(h) for h in SESSION_HEADERS}
    if request_.cli == "codex":
        assert request_.body["prompt_cache_key"] == session
    else:
        assert f'"session_id":"{session}"' in request_.body["metadata"]["user_id"]


def test_every_front_end_s_request_carries_its_session_into_the_request_log(tmp_path: Path) -> None:
    """Through a real server: chat's `prompt_cache_key` beats both headers; a Messages request
    with Claude Code's header and a Responses request with Codex's carry theirs; none without."""
    log = tmp_path / "requests.jsonl"
    config = f'[server]\nrequest_log = "{log}"\n\n' + echo_config(models=["echo-1"])
    both = {"x-claude-code-session-id": "claude-id", "session-id": "codex-id"}
    sent = [
        ("chat-body", "/v1/chat/completions", {"prompt_cache_key": "body-id", "messages": [{"role": "user", "content": "hi"}]}, both),
        ("chat-header", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, both),
        ("messages", "/v1/messages?beta=true", {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
         {"X-Claude-Code-Session-Id": "claude-id", "anthropic-version": "2023-06-01"}),
        ("responses", "/v1/responses", {"input": "hi", "stream": True}, {"session-id": "codex-id"}),
        ("none", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, {"thread-id": "t"}),
    ]
    with running_server(config, tmp_path) as base:
        for request_id, path, body, headers in sent:
            reply = httpx.post(base + path, json={"model": "echo-1", **body}, headers={**headers, "x-request-id": request_id})
            assert reply.status_code == 200, reply.text
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(log.read_text().splitlines() if log.exists() else []) < len(sent):
            time.sleep(0.05)
    logged = {(d := json.loads(line))["request_id"]: d.get("session") for line in log.read_text().splitlines()}
    assert logged == {"chat-body": "body-id", "chat-header": "claude-id", "messages": "claude-id", "responses": "codex-id",
                      "none": None}
