"""The agent session a request belongs to (`RequestSpec.session`), decided here once for every
front-end.

Coding agents resend a growing conversation every turn and say which conversation it is: in
the body where the API has a field for it — `prompt_cache_key` (chat completions, Responses;
Codex sends its session id there), `session_id` inside Messages' `metadata.user_id` (Claude
Code) — which each front-end's `translate` puts into the spec, and in headers:
`X-Claude-Code-Session-Id` (Claude Code), `session-id` (Codex).

Precedence, first present wins: the body's id, then `X-Claude-Code-Session-Id`, then
`session-id`. The body's id is what the client set for this very request in the API's own terms
(OpenAI's `prompt_cache_key` exists to group requests for its cache); the headers are the
CLIs' own, and both CLIs send the same id in both places. A value longer than
`MAX_SESSION_CHARS` is no session id (not used). The session only routes (a `sticky` route's
`session` key, `prefix_cache`'s session table); it never reaches the prompt.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from plugins.contract.protocol import RequestSpec

SESSION_HEADERS = ("x-claude-code-session-id", "session-id")  # lower case, in order of precedence
MAX_SESSION_CHARS = 256


def session_of(body_session: str | None, headers: Mapping[str, str]) -> str | None:
    """The session: `body_session` (what the front-end read from the body), else the first
    session header present (`headers` by lower-case name); None when there is none."""
    for value in (body_session, *(headers.get(name) for name in SESSION_HEADERS)):
        if value:
            value = value.strip()
            if value and len(value) <= MAX_SESSION_CHARS:
                return value
    return None


def with_session(spec: RequestSpec, headers: Mapping[str, str]) -> RequestSpec:
    """`spec` with its session decided (the same object when nothing changes)."""
    session = session_of(spec.session, headers)
    return spec if session == spec.session else msgspec.structs.replace(spec, session=session)
