"""The real Claude Code CLI (pinned; `python -m engines.install agents`) against a gateway on a free
loopback port, run as a user runs it: `claude -p <prompt> --output-format stream-json --verbose`
with only `ANTHROPIC_BASE_URL` and a key pointing it here (engines/agents.py), its JSON lines read.

- the built-in engine, tools off and a short system prompt: an answer;
- the built-in engine, Claude Code's default tools and system prompt (~4.1k tokens for a model it
  does not know; the engine here gets a context of 4,096, so that the path is seen in seconds on
  a CPU): Anthropic's wording of the overflow, on which Claude Code either shows its context
  error or asks again with less and gets an answer — never a hang, a 5xx or a 400 on a field it
  sent;
- a tool round trip through the scripted backend (tests/support/script_backend.py): the model
  calls `Read` on a file in the working directory, Claude Code reads it and sends the result, the
  answer quotes it — Anthropic's tool_use / tool_result turns through the gateway both ways;
- Claude Code's own `max_tokens` (32000) over a context of 8,192: the gateway's Anthropic wording
  of the overflow makes Claude Code ask again with what fits, and it answers.

The CLI against llama.cpp and vLLM behind the gateway: tests/e2e/real_engines/test_claude_code_real.py.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engines import agents, install
from tests.support.server import running_server

pytestmark = pytest.mark.skipif(not install.agent_installed(install.CLAUDE_CODE),
                                reason="Claude Code is not installed; run `python -m engines.install agents`")

MODEL = "smollm2-135m-instruct"
RUN_TIMEOUT_S = 420  # a turn on the CPU, on a machine shared with other jobs
NOTE = "trains wait on track 7"
BUILTIN_CONTEXT = 4096  # below Claude Code's default request (~4.1k tokens), above its bare one (~0.4k)
OUTPUT_TOKENS = "24"  # CLAUDE_CODE_MAX_OUTPUT_TOKENS: a few seconds a try for the tiny model on a CPU


@dataclass
class ClaudeRun:
    lines: list[dict[str, Any]]  # stdout's JSON lines
    stderr: str
    returncode: int

    @property
    def result(self) -> dict[str, Any]:
        (result,) = [line for line in self.lines if line.get("type") == "result"]
        return result

    def blocks(self, role: str) -> list[dict[str, Any]]:
        """The content blocks of every `assistant` / `user` line, in order."""
        return [block for line in self.lines if line.get("type") == role
                for block in (line["message"]["content"] if isinstance(line["message"]["content"], list) else [])]


def run_claude(prompt: str, *, base: str, home: Path, **options: Any) -> ClaudeRun:
    command = agents.claude_command(prompt, base_url=base, home=home, **options)
    work = home / "work"
    work.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(command.argv, env=command.env, cwd=work, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[0].get("type") == "system" and lines[0].get("subtype") == "init", done.stdout[-2000:]
    return ClaudeRun(lines=lines, stderr=done.stderr, returncode=done.returncode)


def config(log: Path) -> str:
    """The built-in engine with its system turns folded (`system_messages = "fold"`: the tiny model
    answers Claude Code's trailing environment turn by rambling) and a context of BUILTIN_CONTEXT, and the
    scripted backend twice: with room for Claude Code's whole request, and with the default
    model's context (one word a token)."""
    return f"""[server]
request_log = "{log}"

[plugins]
modules = ["tests.support.script_backend"]

[[backends]]
name = "builtin"
type = "builtin"
[backends.options]
model = "{MODEL}"
num_threads = 1
max_model_len = {BUILTIN_CONTEXT}
system_messages = "fold"

[[backends]]
name = "script"
type = "script"
[backends.options]
models = ["claude-script"]
max_model_len = 200000

[[backends]]
name = "script-8k"
type = "script"
[backends.options]
models = ["claude-script-8k"]
max_model_len = 8192
"""


@dataclass
class Gateway:
    base: str
    log: Path

    def requests(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def sent_since(self, before: int, count: int = 1) -> list[dict[str, Any]]:
        """The request log's lines after the first `before`, once there are `count` of them: a
        request's line is written after its answer has gone, so the CLI may be done first."""
        deadline = time.monotonic() + 10
        while len(sent := self.requests()[before:]) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return sent


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("claude-code-gateway")
    log = tmp / "requests.jsonl"
    with running_server(config(log), tmp, ready_timeout=300) as base:
        yield Gateway(base=base, log=log)


def test_tools_off_and_a_short_system_prompt_answer(gateway: Gateway, tmp_path: Path) -> None:
    """Claude Code's bare request (`--tools ""`, its own system prompt) is answered by the engine.
    It sends no temperature, so the tiny model samples at Anthropic's default of 1 and may ramble
    past `CLAUDE_CODE_MAX_OUTPUT_TOKENS`; Claude Code then asks it to go on, a few times, and may
    end by saying the answer ran past its maximum — its own choice, after answers that arrived."""
    before = len(gateway.requests())
    run = run_claude("Name a colour.", base=gateway.base, home=tmp_path, model=MODEL, tools=[],
                     system_prompt="You are a terse assistant.", extra_env={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": OUTPUT_TOKENS})
    answers = [line["message"] for line in run.lines
               if line.get("type") == "assistant" and line["message"].get("model") == MODEL]
    assert answers and all(block["type"] == "text" for message in answers for block in message["content"]), run.lines
    assert "".join(block["text"] for message in answers for block in message["content"]).strip()
    sent = gateway.sent_since(before, len({message["id"] for message in answers}))
    assert sent and {r["outcome"] for r in sent} == {"ok"}, sent
    result = run.result
    if result["is_error"]:
        assert "output token maximum" in result["result"], result
    else:
        assert result["subtype"] == "success" and result["result"].strip(), result


def test_default_tools_and_system_prompt_an_answer_or_the_context_error(gateway: Gateway, tmp_path: Path) -> None:
    """The first request (~4.1k tokens) does not fit the context of 4,096: the gateway says
    `prompt is too long: N tokens > 4096 maximum`, Anthropic's words; Claude Code either shows its
    context error or asks again with less, which is answered. Either way every request was answered
    with a 200 or that 400: no 5xx, no field refused."""
    before = len(gateway.requests())
    run = run_claude("Name a colour.", base=gateway.base, home=tmp_path, model=MODEL,
                     extra_env={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": OUTPUT_TOKENS})
    result = run.result
    sent = gateway.sent_since(before)
    assert sent[0]["error"] == "context_length_exceeded", sent
    assert {r["outcome"] for r in sent} <= {"ok", "error:ContextLengthExceeded"}, sent
    if result["is_error"]:
        assert result["result"].startswith("Prompt is too long"), result
    else:
        assert result["subtype"] == "success" and result["result"].strip(), result
        assert sent[-1]["outcome"] == "ok" and sent[-1]["prompt_tokens"] < BUILTIN_CONTEXT


def test_a_tool_round_trip(gateway: Gateway, tmp_path: Path) -> None:
    """The scripted model calls Claude Code's `Read` on a file in the working directory (the
    prompt carries the call; see script_backend), then answers with the tool's result."""
    (tmp_path / "work").mkdir()
    note = tmp_path / "work" / "notes.txt"
    note.write_text(NOTE + "\n")
    call = json.dumps({"file_path": str(note)}, separators=(",", ":"))
    before = len(gateway.requests())
    run = run_claude(f"CALLJSON Read {call}", base=gateway.base, home=tmp_path, model="claude-script")
    (use,) = [b for b in run.blocks("assistant") if b["type"] == "tool_use"]
    assert use["name"] == "Read" and use["input"] == {"file_path": str(note)}
    (result,) = [b for b in run.blocks("user") if b["type"] == "tool_result"]
    assert result["tool_use_id"] == use["id"] and NOTE in json.dumps(result["content"])
    final = run.result
    assert final["subtype"] == "success" and final["is_error"] is False, final
    assert final["result"].startswith("result:") and NOTE in final["result"]
    assert [r["outcome"] for r in gateway.sent_since(before, 2)] == ["ok", "ok"]


def test_claude_codes_max_tokens_over_the_context_is_asked_again_with_what_fits(gateway: Gateway,
                                                                               tmp_path: Path) -> None:
    """32000 output tokens do not fit a context of 8,192: the gateway answers Anthropic's `input
    length and max_tokens exceed context limit: P + 32000 > 8192`, and Claude Code sends the same
    request again with `max_tokens` = 8192 - P - 1000, which is answered."""
    before = len(gateway.requests())
    run = run_claude("red green blue", base=gateway.base, home=tmp_path, model="claude-script-8k", tools=[],
                     system_prompt="You are a terse assistant.")
    final = run.result
    assert final["subtype"] == "success" and final["result"] == "red green blue", final
    first, second = gateway.sent_since(before, 2)
    assert (first["error"], second["outcome"]) == ("context_length_exceeded", "ok")
