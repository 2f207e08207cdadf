"""Multi-turn agent sessions shaped like the recorded ones (tests/recordings/agents/), for the
session-routing test (tests/e2e/test_agent_sessions.py) and `bench/agent_sessions.py`.

Each session starts from a recorded first request of its CLI — Claude Code's `POST
/v1/messages?beta=true` or Codex's `POST /v1/responses`, with their headers — and grows as the
CLI grows it: every turn resends the whole conversation, the model's earlier answers included,
and a new user line. Fitted to a small model's context:

- the long system text (Claude Code's third system block, Codex's first developer message) is
  cut to `Fit.system_chars`, Claude Code's environment message (9 KB: its deferred tools and
  agent types) to `Fit.environment_chars`, and only the first `Fit.tools` tools are kept (their descriptions
  cut to `Fit.tool_chars`);
- the session's own id goes where the CLI puts it: Claude Code's `X-Claude-Code-Session-Id`
  header and `session_id` in `metadata.user_id`; Codex's `session-id` / `thread-id` headers and
  `prompt_cache_key`;
- Claude Code's billing line gets a `cch=<5 hex>;` that changes every request, as the releases
  that add it send (2.1.332's own line, recorded, changes only with the first prompt): the worst
  case for a prefix cache, which the gateway's `strip_billing_header` undoes;
- `temperature: 0` and a small output cap are added so that arms of a benchmark grow the same
  histories.

Everything else is the recorded shape: Claude Code's `thinking`, `context_management`,
`output_config` and its `role: "system"` environment message after the first user turn, Codex's
`client_metadata` and its `namespace` / `web_search` tools (cut with the others to `Fit.tools`).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support import agent_recordings

HEADERS = {  # the recorded headers sent again (lower case); the session's own id replaces the recorded one
    "claude": ("user-agent", "anthropic-version", "anthropic-beta", "x-app", "x-claude-code-session-id", "x-stainless-timeout"),
    "codex": ("user-agent", "originator", "accept", "session-id", "thread-id", "x-codex-window-id"),
}
TOPICS = ("the build script", "the test runner", "the config loader", "the HTTP client", "the cache layer",
          "the CLI parser", "the log rotation", "the retry policy", "the schema migrations", "the auth middleware",
          "the metrics exporter", "the job queue")


@dataclass(frozen=True)
class Fit:
    system_chars: int = 2400
    tools: int = 2
    tool_chars: int = 240
    environment_chars: int = 480  # Claude Code's `role: "system"` environment turn: its first lines
    max_tokens: int = 16
    turn_chars: int = 0  # from the second turn on, each user turn also pastes this much command output


def _hex(*parts: object, n: int) -> str:
    return hashlib.blake2b("\x00".join(map(str, parts)).encode(), digest_size=16).hexdigest()[:n]


def session_id(cli: str, index: int, seed: int = 0) -> str:
    """A UUID-shaped id, fixed by (cli, index, seed)."""
    h = _hex(cli, index, seed, n=32)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass
class AgentSession:
    """One agent session; `request(turn)` is the next turn's (path, headers, body), `answered`
    appends the model's answer to the history."""

    cli: str  # "claude" | "codex"
    index: int
    model: str
    fit: Fit = Fit()
    seed: int = 0
    answers: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.id = session_id(self.cli, self.index, self.seed)
        self.recorded = first_request(self.cli)
        self.topic = TOPICS[self.index % len(TOPICS)]

    def question(self, turn: int) -> str:
        if turn == 0:
            return f"Task {self.index}: look at {self.topic} and name the first thing to check."
        return f"Step {turn} of task {self.index}: and after that, what next in {self.topic}? One line."

    def pasted(self, turn: int) -> str | None:
        """The command output a later user turn carries (what an agent's tool results add to the
        history), distinct per session and turn; None without `Fit.turn_chars`."""
        if turn == 0 or not self.fit.turn_chars:
            return None
        name = self.topic.split()[-1].replace("_", "")
        lines, k = [f"$ sed -n {turn * 40},{turn * 40 + 39}p src/{name}.py"], 0
        while sum(len(line) + 1 for line in lines) < self.fit.turn_chars:
            k += 1
            lines.append(f"    {name}_{turn}_{k} = check({self.index}, {_hex(self.id, turn, k, n=6)!r})  # step {k}")
        return "\n".join(lines)[: self.fit.turn_chars]

    def answered(self, text: str) -> None:
        self.answers.append(text)

    @property
    def path(self) -> str:
        return self.recorded.target

    def headers(self) -> dict[str, str]:
        keep = HEADERS[self.cli]
        out = {name.lower(): value for name, value in self.recorded.headers if name.lower() in keep}
        for name in ("x-claude-code-session-id", "session-id", "thread-id"):
            if name in out:
                out[name] = self.id
        if "x-codex-window-id" in out:
            out["x-codex-window-id"] = f"{self.id}:0"
        out["content-type"] = "application/json"
        return out

    def body(self, turn: int) -> dict[str, Any]:
        """The request of turn `turn` (from 0): the history of turns before it, answered."""
        assert turn <= len(self.answers), "answer every turn before asking the next"
        body = copy.deepcopy(self.recorded.body)
        body["model"] = self.model
        body["temperature"] = 0
        tools = self._tools(body.pop("tools", None) or [])
        if tools:
            body["tools"] = tools
        else:  # as the CLIs send no tool choice without tools
            body.pop("tool_choice", None)
            body.pop("parallel_tool_calls", None)
        if self.cli == "claude":
            self._claude(body, turn)
        else:
            self._codex(body, turn)
        return body

    def _tools(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        kept = [t for t in tools if not t.get("defer_loading")]
        kept = kept[: self.fit.tools]
        for tool in kept:
            tool["description"] = tool.get("description", "")[: self.fit.tool_chars]
        return kept

    def _claude(self, body: dict[str, Any], turn: int) -> None:
        billing, agent, system = body["system"]
        billing["text"] = billing["text"] + f" cch={_hex(self.id, turn, n=5)};"
        system["text"] = system["text"][: self.fit.system_chars]
        body["system"] = [billing, agent, system]
        user = json.loads(body["metadata"]["user_id"])
        user["session_id"] = self.id
        body["metadata"]["user_id"] = json.dumps(user, separators=(",", ":"))
        body["max_tokens"] = self.fit.max_tokens
        first, environment = body["messages"]  # the user's first words, then Claude Code's `role: "system"` turn
        for part in environment["content"]:
            part["text"] = part["text"][: self.fit.environment_chars]
        first["content"] = [*first["content"][:-1], {"type": "text", "text": self.question(0)}]
        messages = [first, environment]
        for t in range(1, turn + 1):
            messages.append({"role": "assistant", "content": [{"type": "text", "text": self.answers[t - 1]}]})
            paste = self.pasted(t)
            messages.append({"role": "user", "content": [*([{"type": "text", "text": paste}] if paste else []),
                                                         {"type": "text", "text": self.question(t)}]})
        messages[-1]["content"][-1] = {**messages[-1]["content"][-1], "cache_control": {"type": "ephemeral"}}
        body["messages"] = messages

    def _codex(self, body: dict[str, Any], turn: int) -> None:
        body["prompt_cache_key"] = self.id
        body["max_output_tokens"] = self.fit.max_tokens
        items = [i for i in body["input"] if i.get("type") == "message"]
        developer = [i for i in items if i["role"] == "developer"]
        context = next(i for i in items if i["role"] == "user")  # the environment context
        for item in developer:
            for part in item["content"]:
                part["text"] = part["text"][: self.fit.system_chars // len(developer)]
        history = [*developer, context, _codex_message("user", "input_text", self.question(0))]
        for t in range(1, turn + 1):
            history.append(_codex_message("assistant", "output_text", self.answers[t - 1]))
            history.append(_codex_message("user", "input_text", self.pasted(t), self.question(t)))
        body["input"] = history


def _codex_message(role: str, kind: str, *texts: str | None) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text} for text in texts if text]}


def first_request(cli: str) -> agent_recordings.AgentRequest:
    """The recorded first request of a session with the model named (the `resume` scenario's)."""
    return next(r for r in agent_recordings.api_requests(cli) if r.scenario == "resume" and r.turn == 1)


def sessions(n: int, model: str, fit: Fit = Fit(), seed: int = 0) -> list[AgentSession]:
    """`n` sessions, Claude Code and Codex alternating."""
    return [AgentSession("claude" if i % 2 == 0 else "codex", i, model, fit, seed) for i in range(n)]


@dataclass
class Turn:
    """What one turn's streamed answer said, as the client saw it."""

    session: str
    turn: int
    request_id: str
    status: int = 0
    ttft: float | None = None  # seconds to the first answer text
    text: str = ""
    prompt_tokens: int = 0  # all of the prompt, cached or not
    cached_tokens: int = 0
    backend: str | None = None  # the `x-switchyard-backend` response header
    error: str | None = None


async def send_turn(client: Any, base: str, session: AgentSession, turn: int, *, model: str | None = None,
                    request_id: str | None = None, edit: Callable[[dict[str, Any]], None] | None = None) -> Turn:
    """Send turn `turn` of `session` to `base` (an `httpx.AsyncClient`), read the stream to its
    end and append the answer to the session's history. `model` overrides the session's (an
    oracle's pinned route); `edit` changes the body before it is sent."""
    import time

    result = Turn(session.id, turn, request_id or f"{session.id}-t{turn}")
    body = session.body(turn)
    if model is not None:
        body["model"] = model
    if edit is not None:
        edit(body)
    headers = {**session.headers(), "x-request-id": result.request_id}
    text: list[str] = []
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", base + session.path, json=body, headers=headers) as response:
            result.status = response.status_code
            result.backend = response.headers.get("x-switchyard-backend")
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
            async for line in response.aiter_lines() if result.error is None else _nothing():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                piece = _text_of(event)
                if piece:
                    result.ttft = result.ttft if result.ttft is not None else time.perf_counter() - t0
                    text.append(piece)
                _usage_of(event, result)
                if event.get("type") in ("error", "response.failed"):
                    result.error = json.dumps(event)[:300]
    except Exception as exc:  # noqa: BLE001 - a lost turn is a result
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    result.text = "".join(text)
    if result.error is None and result.ttft is None:
        result.error = "no answer text"
    session.answered(result.text or "(no answer)")
    return result


async def _nothing() -> Any:
    return
    yield


def _text_of(event: dict[str, Any]) -> str:
    kind = event.get("type")
    if kind == "content_block_delta":  # Messages
        return (event.get("delta") or {}).get("text") or ""
    if kind == "response.output_text.delta":  # Responses
        return event.get("delta") or ""
    return ""


def _usage_of(event: dict[str, Any], result: Turn) -> None:
    kind = event.get("type")
    if kind == "message_delta" and event.get("usage"):  # Messages: input_tokens excludes the cache read
        usage = event["usage"]
        cached = usage.get("cache_read_input_tokens") or 0
        if usage.get("input_tokens") is not None:
            result.prompt_tokens, result.cached_tokens = usage["input_tokens"] + cached, cached
    elif kind in ("response.completed", "response.incomplete"):
        usage = (event.get("response") or {}).get("usage") or {}
        result.prompt_tokens = usage.get("input_tokens") or 0
        result.cached_tokens = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
