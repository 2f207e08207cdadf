"""The agent session a request belongs to: the body's id first, then Claude Code's header, then
Codex's; what the real CLIs sent resolves to the session id they meant."""

from __future__ import annotations

import pytest

from gateway.http.sessions import MAX_SESSION_CHARS, SESSION_HEADERS, session_of, with_session
from plugins.contract.protocol import RequestSpec, Sampling
from tests.support import agent_recordings


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
