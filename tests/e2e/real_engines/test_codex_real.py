"""The real Codex CLI through the gateway to real llama.cpp and vLLM servers, its fewest tools and
a short prompt: an answer (scenario (a) of tests/e2e/test_codex_cli.py on the proxied engines).

The engines are conftest's `agent_engine` servers, shared with test_claude_code_real.py: Codex's
prompt (~4,600 tokens) needs the model's whole 8,192-token context (the session's other engines
run at 2,048) and its tools need the engine's tool calling.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engines import install
from engines.launch import ServerProcess
from tests.e2e.test_codex_cli import codex, logged
from tests.support.probes import wait_until
from tests.support.server import running_server

pytestmark = pytest.mark.skipif(not install.agent_installed(install.CODEX), reason="run `python -m engines.install agents`")


def test_codex_gets_an_answer(agent_engine: tuple[str, ServerProcess], tmp_path: Path) -> None:
    name, server = agent_engine
    config = f"""
[server]
request_log = "{tmp_path}/requests.jsonl"
default_max_tokens = 48

[responses]
sqlite_path = "{tmp_path}/responses.sqlite3"
reasoning_key_file = "{tmp_path}/reasoning.key"

[plugins]
disable = ["builtin"]

[[backends]]
name = "{name}"
type = "{name}"
[backends.options]
base_url = "{server.base_url}"
tools = true
"""
    (tmp_path / "gateway").mkdir()
    log = tmp_path / "requests.jsonl"
    with running_server(config, tmp_path / "gateway") as base:
        run = codex(base, tmp_path / "home", "Name a colour.", fewest_tools=True)
        assert wait_until(lambda: bool(logged(log)), timeout=10)
    assert run.answer.strip(), run.events
    # the answer ends, or runs into the 48-token cap, which Codex reports in its own words
    if run.ended != "turn.completed":
        assert run.events[-1]["error"]["message"] == "Incomplete response returned, reason: max_output_tokens", run.events
    (served,) = logged(log)
    assert served["outcome"] == "ok" and served["backend"] == name and served["prompt_tokens"] > 4000
