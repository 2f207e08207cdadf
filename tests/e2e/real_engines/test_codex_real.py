"""The real Codex CLI through the gateway to real llama.cpp and vLLM servers, its fewest tools and
a short prompt: an answer (scenario (a) of tests/e2e/test_codex_cli.py on the proxied engines).

Each engine gets a server of its own, started for this module: Codex's prompt (~4,600 tokens)
needs the model's whole 8,192-token context (the session's engines run at 2,048) and its tools
need the engine's tool calling (`llama-server --jinja`; vLLM `--enable-auto-tool-choice
--tool-call-parser hermes`). Measured here: llama-server up in ~2 s, vLLM (CPU) in ~60 s.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engines import install
from engines.launch import ServerProcess, start_llamacpp, start_vllm
from tests.e2e.test_codex_cli import NAMED, codex, logged
from tests.support.probes import wait_until
from tests.support.server import running_server

pytestmark = pytest.mark.skipif(not install.agent_installed(install.CODEX), reason="run `python -m engines.install agents`")
INSTALLED = {"llamacpp": install.llamacpp_installed, "vllm": install.vllm_installed}


def _start(engine: str, logs: Path) -> ServerProcess:
    if engine == "llamacpp":
        return start_llamacpp(alias=NAMED, ctx_size=8192, parallel=1, threads=1, extra=["--jinja"], log_dir=logs)
    return start_vllm(served_model_names=[NAMED], max_model_len=8192, enforce_eager=True, kv_cache_space_gib=1,
                      extra=["--enable-auto-tool-choice", "--tool-call-parser", "hermes"], log_dir=logs, timeout=600)


@pytest.fixture(scope="module", params=list(INSTALLED))
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ServerProcess]]:
    name = request.param
    if not INSTALLED[name]():
        pytest.skip(f"{name} is not installed; run `python -m engines.install {name}`")
    server = _start(name, tmp_path_factory.mktemp(f"{name}-codex-logs"))
    try:
        yield name, server
    finally:
        server.stop()


def test_codex_gets_an_answer(engine: tuple[str, ServerProcess], tmp_path: Path) -> None:
    name, server = engine
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
