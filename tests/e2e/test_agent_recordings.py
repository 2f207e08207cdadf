"""The corpus of requests the real Claude Code and Codex CLIs sent (tests/recordings/agents/):
complete for the pinned versions, well formed, carrying what the front-ends will have to take
(issue #32). The last test records afresh from the installed CLIs, on loopback only."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from engines import install
from tests.support import agent_recordings
from tests.support.agent_recordings import CLIS, FILE_NAME, SCENARIOS, AgentRequest

PINNED = {"claude": install.CLAUDE_CODE.version, "codex": install.CODEX.version}
SECRET_HEADERS = {"authorization", "x-api-key", "proxy-authorization", "cookie"}
ALL = agent_recordings.load_all()
CLAUDE = agent_recordings.api_requests("claude")
CODEX = agent_recordings.api_requests("codex")


def _ids(requests: list[AgentRequest]) -> list[str]:
    return [r.id for r in requests]


def test_every_scenario_is_recorded_for_the_pinned_versions() -> None:
    """Pinning a new CLI version fails here until `scripts/record_agent_requests.py` has run."""
    found = {(r.cli, r.cli_version, r.scenario) for r in ALL}
    assert found == {(cli, PINNED[cli], scenario) for cli in CLIS for scenario in SCENARIOS}


@pytest.mark.parametrize("request_", ALL, ids=_ids(list(ALL)))
def test_file_name_matches_the_recording(request_: AgentRequest) -> None:
    name = FILE_NAME.match(request_.file.name)
    assert name is not None, request_.file.name
    assert (name["cli"], name["version"], name["scenario"], int(name["n"])) == (
        request_.cli, request_.cli_version, request_.scenario, request_.n)
    assert request_.turn >= 1 and request_.reply


def test_numbers_run_from_one_in_each_scenario() -> None:
    for cli in CLIS:
        for scenario in SCENARIOS:
            numbers = [r.n for r in agent_recordings.load(cli, scenario)]
            assert numbers == list(range(1, len(numbers) + 1))


@pytest.mark.parametrize("request_", ALL, ids=_ids(list(ALL)))
def test_secrets_are_dropped(request_: AgentRequest) -> None:
    for key, value in request_.headers:
        if key.lower() in SECRET_HEADERS:
            assert value == "<dropped>", key
    assert "sk-switchyard-agents" not in json.dumps(request_.body)


def test_every_request_is_a_model_call() -> None:
    """With the settings of engines/agents.py neither CLI probes or phones anything else."""
    assert [r.id for r in ALL if r not in CLAUDE + CODEX] == []
    assert {r.reply for r in CLAUDE} == {"anthropic-sse"} and {r.reply for r in CODEX} == {"responses-sse"}


# -- Claude Code: POST /v1/messages?beta=true ------------------------------------------------------


@pytest.mark.parametrize("request_", CLAUDE, ids=_ids(CLAUDE))
def test_claude_code_request(request_: AgentRequest) -> None:
    body = request_.body
    assert request_.query == {"beta": ["true"]}
    assert request_.header("anthropic-version") == "2023-06-01"
    betas = request_.header("anthropic-beta").split(",")
    assert {"claude-code-20250219", "context-management-2025-06-27", "effort-2025-11-24"} <= set(betas)
    assert request_.header("user-agent").startswith(f"claude-cli/{request_.cli_version} ")
    assert set(body) >= {"model", "messages", "system", "tools", "metadata", "max_tokens", "thinking",
                         "context_management", "output_config", "stream"}
    assert body["stream"] is True and body["max_tokens"] >= 32000
    assert body["thinking"]["type"] == "adaptive"
    assert body["context_management"]["edits"][0]["type"].startswith("clear_thinking_")
    assert body["output_config"]["effort"] in ("low", "medium", "high", "xhigh", "max")
    # metadata.user_id is a JSON string; its session is the session header's
    user = json.loads(body["metadata"]["user_id"])
    assert set(user) >= {"device_id", "session_id"}
    assert user["session_id"] == request_.header("x-claude-code-session-id")
    # three system blocks, the first the per-request billing line
    assert [block["type"] for block in body["system"]] == ["text", "text", "text"]
    assert body["system"][0]["text"].startswith("x-anthropic-billing-header: ")
    assert "cache_control" in body["system"][-1]
    # a system message inside `messages`, after the first user turn
    roles = [m["role"] for m in body["messages"]]
    assert roles[0] == "user" and roles[1] == "system"


def test_claude_code_tools() -> None:
    (bare,) = agent_recordings.load("claude", "bare")
    assert bare.body["tools"] == []
    for request_ in CLAUDE:
        for tool in request_.body["tools"]:
            assert "type" not in tool and set(tool) <= {"name", "description", "input_schema", "defer_loading"}
    (default,) = agent_recordings.load("claude", "default")
    assert {"Bash", "Read", "Edit", "Write", "ToolSearch"} <= {t["name"] for t in default.body["tools"]}
    assert any(t.get("defer_loading") for t in default.body["tools"])


def test_claude_code_model_shapes_the_request() -> None:
    (default,) = agent_recordings.load("claude", "default")
    (named,) = agent_recordings.load("claude", "model")
    assert named.body["model"] == "smollm2-135m-instruct" and default.body["model"] != named.body["model"]
    assert (default.body["max_tokens"], named.body["max_tokens"]) == (128000, 32000)


def test_claude_code_tool_round_trip() -> None:
    first, second = agent_recordings.load("claude", "tool")
    assert first.reply == "anthropic-sse" and first.turn == second.turn == 1
    assistant, result = second.body["messages"][-2:]
    (use,) = assistant["content"]
    (block,) = result["content"]
    assert (use["type"], use["name"]) == ("tool_use", "Read")
    assert block["type"] == "tool_result" and block["tool_use_id"] == use["id"]
    assert "trains wait on track 7" in block["content"]


def test_claude_code_resumed_session_resends_the_first_turn() -> None:
    first, second = agent_recordings.load("claude", "resume")
    assert (first.turn, second.turn) == (1, 2)
    assert second.header("x-claude-code-session-id") == first.header("x-claude-code-session-id")
    assert second.body["system"] == first.body["system"] and second.body["tools"] == first.body["tools"]
    assert second.body["messages"][0] == first.body["messages"][0]
    assert [m["role"] for m in second.body["messages"]] == ["user", "system", "assistant", "user"]


# -- Codex: POST /v1/responses --------------------------------------------------------------------


@pytest.mark.parametrize("request_", CODEX, ids=_ids(CODEX))
def test_codex_request(request_: AgentRequest) -> None:
    body = request_.body
    assert request_.header("accept") == "text/event-stream"
    assert request_.header("originator") == "codex_exec"
    assert request_.header("user-agent").startswith(f"codex_exec/{request_.cli_version} ")
    assert set(body) >= {"model", "input", "tool_choice", "parallel_tool_calls", "reasoning", "store", "stream",
                         "include", "prompt_cache_key", "client_metadata"}
    assert "instructions" not in body  # the system prompt is developer messages in `input`
    assert body["stream"] is True and body["store"] is False
    assert body["include"] == ["reasoning.encrypted_content"]
    assert isinstance(body["parallel_tool_calls"], bool)
    assert set(body["reasoning"]) <= {"effort", "summary", "context"} and body["reasoning"]
    metadata = body["client_metadata"]
    assert all(isinstance(value, str) for value in metadata.values())
    assert metadata["session_id"] == body["prompt_cache_key"] == request_.header("session-id")
    assert json.loads(metadata["x-codex-turn-metadata"])["model"] == body["model"]
    assert [item["role"] for item in body["input"] if item.get("type") == "message"][0] == "developer"


def test_codex_tools() -> None:
    (named,) = agent_recordings.load("codex", "model")
    types = {t["type"] for t in named.body["tools"]}
    assert types == {"function", "namespace", "web_search"}
    assert "exec_command" in {t.get("name") for t in named.body["tools"]}
    (bare,) = agent_recordings.load("codex", "bare")
    assert {t["type"] for t in bare.body["tools"]} == {"function"}
    assert len(bare.body["tools"]) < len(named.body["tools"])
    # its own model: "code mode", the tools as an input item and no `tools` field
    (default,) = agent_recordings.load("codex", "default")
    assert "tools" not in default.body
    (extra,) = [item for item in default.body["input"] if item["type"] == "additional_tools"]
    assert {t["type"] for t in extra["tools"]} == {"namespace"}
    inner = [tool for namespace in extra["tools"] for tool in namespace["tools"]]
    (code,) = [tool for tool in inner if tool["type"] == "custom"]
    assert code["name"] == "exec" and code["format"]["type"] == "grammar"


def test_codex_tool_round_trip() -> None:
    first, second = agent_recordings.load("codex", "tool")
    call, output = second.body["input"][-2:]
    assert (call["type"], call["name"]) == ("function_call", "exec_command")
    assert output["type"] == "function_call_output" and output["call_id"] == call["call_id"]
    assert "trains wait on track 7" in output["output"]
    assert second.body["input"][:-2] == first.body["input"]


def test_codex_resumed_session_resends_the_whole_history() -> None:
    first, second = agent_recordings.load("codex", "resume")
    assert (first.turn, second.turn) == (1, 2)
    assert second.body["input"][:len(first.body["input"])] == first.body["input"]
    assert [item.get("role") for item in second.body["input"][len(first.body["input"]):]] == ["assistant", "user"]
    assert second.body["prompt_cache_key"] == first.body["prompt_cache_key"]


# -- the real CLIs, afresh --------------------------------------------------------------------------


def _strace_works() -> bool:
    """strace is installed and may trace here (containers often forbid ptrace)."""
    if shutil.which("strace") is None:
        return False
    return subprocess.run(["strace", "-f", "-qq", "-e", "trace=none", "true"], capture_output=True).returncode == 0


@pytest.mark.parametrize("cli", CLIS)
def test_the_installed_cli_sends_a_recordable_request_on_loopback_only(cli: str) -> None:
    """`bare` scenario through scripts/record_agent_requests.py, with each connect() traced."""
    agent = install.CLAUDE_CODE if cli == "claude" else install.CODEX
    if not install.agent_installed(agent):
        pytest.skip(f"{agent.package} is not installed; run `python -m engines.install agents`")
    from scripts import record_agent_requests as recorder

    strace = _strace_works()
    records, turns = recorder.run_scenario(cli, "bare", strace=strace)
    (turn,) = turns
    assert turn.returncode == 0, turn.stderr[-2000:]
    assert [(r["method"], r["path"].split("?")[0]) for r in records] == [("POST", agent_recordings.API_PATH[cli])]
    (recorded,) = agent_recordings.load(cli, "bare")
    assert set(records[0]["body"]) == set(recorded.body)
    if strace:
        outside = [c for c in turn.connects if "AF_INET" in c and "127.0.0.1" not in c]
        assert outside == [], outside
