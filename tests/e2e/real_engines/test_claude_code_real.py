"""The real Claude Code CLI through the gateway to real llama.cpp and vLLM servers (scenarios (a)
and (b) of tests/e2e/test_claude_code.py on the proxied engines), run as that file runs it:
`claude -p ... --output-format stream-json --verbose`, its JSON lines read.

(a) tools off and a short system prompt: an answer, every Messages request `ok` and served by
    that engine;
(b) Claude Code's default tools and system prompt (~4,100 tokens for a model it does not know,
    more once an engine's chat template renders the tools): an answer, or the engine's own
    context error in Anthropic's words, `prompt is too long: N tokens > M maximum`, which the CLI
    shows as "Prompt is too long" — never a hang (each run is timed out), a 5xx, or a 400 on a
    field it sent (at 8,192 tokens both engines answered it in every run here: ~4,115 prompt tokens);
(c) a system prompt over the context: the engine's own context error, in Anthropic's words
    through the gateway, read by the CLI ("Prompt is too long · the request is ~N tokens (limit
    8192)").

The engines are conftest's `agent_engine` servers (the model's whole 8,192-token context, tool
calling on), shared with test_codex_real.py. `CLAUDE_CODE_MAX_OUTPUT_TOKENS` keeps each answer
to a few seconds on a CPU.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engines import install
from engines.launch import ServerProcess
from tests.e2e.real_engines.conftest import AGENT_CONTEXT, MODEL
from tests.e2e.test_claude_code import OUTPUT_TOKENS, ClaudeRun, Gateway, run_claude
from tests.support.probes import wait_until
from tests.support.server import running_server

pytestmark = pytest.mark.skipif(not install.agent_installed(install.CLAUDE_CODE),
                                reason="Claude Code is not installed; run `python -m engines.install agents`")

SHORT_SYSTEM = "You are a terse assistant."
CONTEXT_ERROR = "error:ContextLengthExceeded"  # the request log's outcome for a prompt over the context
OVER_THE_CONTEXT = "track " * 9000  # ~9,000 tokens, over AGENT_CONTEXT by itself


def config(name: str, server: ServerProcess, log: Path) -> str:
    """The engine behind a proxy of its type, tools on, Claude Code's trailing environment turn
    folded into the system prompt (`system_messages = "fold"`: the tiny model answers a system
    turn after the user's by rambling on)."""
    return f"""[server]
request_log = "{log}"

[plugins]
disable = ["builtin"]

[[backends]]
name = "{name}"
type = "{name}"
[backends.options]
base_url = "{server.base_url}"
tools = true
system_messages = "fold"
"""


@pytest.fixture(scope="module")
def gateway(agent_engine: tuple[str, ServerProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    name, server = agent_engine
    tmp = tmp_path_factory.mktemp(f"claude-code-{name}")
    log = tmp / "requests.jsonl"
    with running_server(config(name, server, log), tmp) as base:
        yield Gateway(base=base, log=log)


def _answers(run: ClaudeRun) -> list[dict[str, Any]]:
    """The model's messages, as Claude Code printed them."""
    return [line["message"] for line in run.lines
            if line.get("type") == "assistant" and line["message"].get("model") == MODEL]


def _sent(gateway: Gateway, run: ClaudeRun, count: int) -> list[dict[str, Any]]:
    """The request log's lines of this run (its session, which the gateway reads from Claude Code's
    `metadata.user_id`), once there are `count`: a line is written after its answer has gone, so
    the CLI may be done first, and the next test's run must not see this one's."""
    session = run.result["session_id"]

    def sent() -> list[dict[str, Any]]:
        return [r for r in gateway.requests() if r.get("session") == session]

    wait_until(lambda: len(sent()) >= count, timeout=10)
    return sent()


def _assert_answered_or_ran_past_its_maximum(run: ClaudeRun) -> None:
    """Claude Code sends no temperature, so the tiny model samples at 1 and may ramble past
    `CLAUDE_CODE_MAX_OUTPUT_TOKENS`; Claude Code then asks it to go on, a few times, and may end by
    saying the answer ran past its maximum: its own choice, after answers that arrived."""
    result = run.result
    if result["is_error"]:
        assert "output token maximum" in result["result"], result
    else:
        assert result["subtype"] == "success" and result["result"].strip(), result


def test_tools_off_and_a_short_system_prompt_answer(agent_engine: tuple[str, ServerProcess], gateway: Gateway,
                                                    tmp_path: Path) -> None:
    name, _ = agent_engine
    run = run_claude("Name a colour.", base=gateway.base, home=tmp_path, model=MODEL, tools=[],
                     system_prompt=SHORT_SYSTEM, extra_env={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": OUTPUT_TOKENS})
    answers = _answers(run)
    assert answers and all(block["type"] == "text" for message in answers for block in message["content"]), run.lines
    assert "".join(block["text"] for message in answers for block in message["content"]).strip()
    answered = len({message["id"] for message in answers})
    sent = _sent(gateway, run, answered)
    assert len(sent) == answered and {(r["outcome"], r["backend"]) for r in sent} == {("ok", name)}, sent
    _assert_answered_or_ran_past_its_maximum(run)


def test_default_tools_and_system_prompt_an_answer_or_the_context_error(agent_engine: tuple[str, ServerProcess],
                                                                        gateway: Gateway, tmp_path: Path) -> None:
    name, _ = agent_engine
    run = run_claude("Name a colour.", base=gateway.base, home=tmp_path, model=MODEL,
                     extra_env={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": OUTPUT_TOKENS})
    too_long = run.result["is_error"] and run.result["result"].startswith("Prompt is too long")
    sent = _sent(gateway, run, len({message["id"] for message in _answers(run)}) + too_long)
    assert sent and {r["outcome"] for r in sent} <= {"ok", CONTEXT_ERROR}, sent
    assert {r["backend"] for r in sent} == {name}, sent
    first = sent[0]  # Claude Code's tools and system prompt went to the engine
    assert first["outcome"] == CONTEXT_ERROR or first["prompt_tokens"] > 3000, first
    if too_long:
        assert sent[-1]["error"] == "context_length_exceeded", sent
    else:
        assert _answers(run) and sent[-1]["outcome"] == "ok", (run.lines, sent)
        _assert_answered_or_ran_past_its_maximum(run)


def test_a_prompt_over_the_context_is_the_engines_error_in_anthropics_words(agent_engine: tuple[str, ServerProcess],
                                                                          gateway: Gateway, tmp_path: Path) -> None:
    """A system prompt of ~9,000 tokens does not fit the engine's 8,192: the engine refuses it, the
    gateway says so as Anthropic does, and Claude Code shows its own "Prompt is too long"."""
    name, _ = agent_engine
    run = run_claude("Name a colour.", base=gateway.base, home=tmp_path, model=MODEL, tools=[],
                     system_prompt=SHORT_SYSTEM, extra_args=["--append-system-prompt", OVER_THE_CONTEXT],
                     extra_env={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": OUTPUT_TOKENS})
    result = run.result
    assert result["is_error"] and result["terminal_reason"] == "prompt_too_long", result
    # Claude Code read the numbers of `prompt is too long: N tokens > 8192 maximum`
    shown = re.match(rf"Prompt is too long · the request is ~(\d+) tokens \(limit {AGENT_CONTEXT}\)", result["result"])
    assert shown and int(shown[1]) > AGENT_CONTEXT, result
    sent = _sent(gateway, run, 1)
    assert sent and all(r["error"] == "context_length_exceeded" and r["attempts"] == [
        {"backend": name, "outcome": "context_length_exceeded"}] for r in sent), sent
