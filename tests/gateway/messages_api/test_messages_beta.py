"""The Messages API as Claude Code calls it (the beta API, `?beta=true`), through a real server
with the official `anthropic` client's beta resource and raw HTTP: the beta fields accepted and
acted on or counted as ignored, the refused ones named, a context overflow in Anthropic's words,
and the probes Anthropic's clients send."""

from __future__ import annotations

import json
import re

import anthropic
import httpx
import pytest

from tests.gateway.script_server import KEY, Server
from tests.support.probes import metric

CLAUDE_CODE_BETAS = ["claude-code-20250219", "interleaved-thinking-2025-05-14", "context-management-2025-06-27",
                     "effort-2025-11-24", "thinking-display-updates-2026-08-18", "advanced-tool-use-2025-11-20"]
SESSION = "6a1bbaca-9207-4f69-8046-25f91957cbb5"
USER_ID = json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": SESSION})
READ = {"name": "Read", "description": "Read a file.",
        "input_schema": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                         "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}
DEFERRED = {"name": "DeferredToolPlaceholder", "description": "x", "input_schema": {"type": "object"},
            "defer_loading": True}
# Anthropic's own wordings, as Claude Code matches them
TOO_LONG = re.compile(r"^prompt is too long: (\d+) tokens > (\d+) maximum$")
OVER_CONTEXT = re.compile(r"^input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+), "
                          r"decrease input length or `max_tokens` and try again$")


def claude_code_request(said: str, **extra: object) -> dict:
    """A request shaped as Claude Code 2.1.332 sends it (tests/recordings/agents/): the user's
    words (`said`, which the scripted backend plays back), then a system turn."""
    return {
        "model": "claude-agent", "max_tokens": 32000, "stream": True,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.b81; cc_entrypoint=sdk-cli;"},
                   {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": said}]},
                     {"role": "system", "content": [{"type": "text", "text": "# Environment\ncwd: /tmp",
                                                     "cache_control": {"type": "ephemeral"}}]}],
        "tools": [READ, DEFERRED], "metadata": {"user_id": USER_ID},
        "thinking": {"type": "adaptive", "display": "updates"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"}, **extra,
    }


def post(server: Server, body: dict, path: str = "/v1/messages?beta=true", **headers: str) -> httpx.Response:
    return httpx.post(server.base + path, json=body, timeout=30,
                      headers={"x-api-key": KEY, "anthropic-version": "2023-06-01",
                               "anthropic-beta": ",".join(CLAUDE_CODE_BETAS), **headers})


def events(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]


def test_claude_codes_request_streams_an_answer(server: Server) -> None:
    before = httpx.get(server.base + "/metrics").text
    stream = events(post(server, claude_code_request("red green"), **{"x-claude-code-session-id": SESSION}))
    assert [e["type"] for e in stream][:2] == ["message_start", "content_block_start"]
    assert stream[-1] == {"type": "message_stop"}
    text = "".join(e["delta"]["text"] for e in stream if e["type"] == "content_block_delta")
    assert text == "red green"
    after = httpx.get(server.base + "/metrics").text
    counted = {"api": "messages", "field": "context_management"}
    assert metric(after, "switchyard_ignored_fields_total", **counted) == (
        metric(before, "switchyard_ignored_fields_total", **counted) or 0) + 1


def test_the_beta_client(claude: anthropic.Anthropic) -> None:
    body = claude_code_request("blue", stream=False)
    del body["stream"]
    message = claude.beta.messages.create(betas=CLAUDE_CODE_BETAS, **body)
    assert message.content[0].text == "blue" and message.stop_reason == "end_turn"
    with claude.beta.messages.stream(betas=CLAUDE_CODE_BETAS, **body) as stream:
        assert "".join(stream.text_stream) == "blue"
    counted = claude.beta.messages.count_tokens(
        betas=CLAUDE_CODE_BETAS, **{k: v for k, v in body.items() if k in (
            "model", "messages", "system", "tools", "thinking", "context_management", "output_config")})
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens


def test_fields_of_the_standard_api(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(model="claude-echo", max_tokens=20, messages=[{"role": "user", "content": "ok"}],
                                     cache_control={"type": "ephemeral"}, speed="standard", inference_geo="eu",
                                     service_tier="auto", output_config={"effort": "low"},
                                     thinking={"type": "adaptive", "display": "summarized"})
    assert message.content[0].text == "ok"


def test_thinking_display_omitted(claude: anthropic.Anthropic, server: Server) -> None:
    kwargs = dict(model="claude-echo", max_tokens=50, messages=[{"role": "user", "content": "THINK a b ANSWER c"}],
                  thinking={"type": "adaptive", "display": "omitted"})
    message = claude.beta.messages.create(**kwargs)
    assert [(b.type, getattr(b, "thinking", None)) for b in message.content] == [("thinking", ""), ("text", None)]
    assert message.content[0].signature
    stream = events(post(server, {**kwargs, "stream": True}))
    deltas = [e["delta"]["type"] for e in stream if e["type"] == "content_block_delta"]
    assert deltas == ["signature_delta", "text_delta"]


@pytest.mark.parametrize(("field", "value"), [
    ("mcp_servers", [{"type": "url", "url": "https://mcp.example/sse", "name": "x"}]),
    ("container", "container_1"),
    ("thread", {"type": "create"}),
    ("compaction", {"type": "summarize"}),
])
def test_refused_fields_are_named(server: Server, field: str, value: object) -> None:
    response = post(server, claude_code_request("x", **{field: value}))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and f"`{field}` is not supported" in error["message"]


def test_a_field_no_sdk_lists_is_still_a_400(server: Server) -> None:
    response = post(server, claude_code_request("x", context_managment={}))
    assert response.status_code == 400 and "context_managment" in response.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_context_overflow_in_anthropics_words(claude: anthropic.Anthropic, stream: bool) -> None:
    """`claude-echo` has a context of 256 tokens (one a word)."""
    def create(**kwargs: object) -> None:
        kwargs = {"model": "claude-echo", "stream": stream, **kwargs}
        response = claude.beta.messages.create(**kwargs)
        if stream:
            list(response)

    with pytest.raises(anthropic.BadRequestError) as info:
        create(max_tokens=10, messages=[{"role": "user", "content": "w " * 300}])
    assert info.value.body["error"]["type"] == "invalid_request_error"
    prompt, context = map(int, TOO_LONG.match(info.value.body["error"]["message"]).groups())
    assert prompt > context == 256
    with pytest.raises(anthropic.BadRequestError) as info:
        create(max_tokens=1000, messages=[{"role": "user", "content": "w " * 10}])
    prompt, max_tokens, context = map(int, OVER_CONTEXT.match(info.value.body["error"]["message"]).groups())
    assert (max_tokens, context) == (1000, 256) and prompt + max_tokens > context > prompt


@pytest.mark.parametrize("path", ["/", "/api/hello"])
def test_probes_answer_without_a_key(server: Server, path: str) -> None:
    assert httpx.head(server.base + path).status_code == 200
    got = httpx.get(server.base + path)
    assert got.status_code == 200 and got.json() == {"status": "ok"}
    assert httpx.post(server.base + path).status_code == 405
