"""Session fixtures for the real-engine tests: llama.cpp and vLLM serving the default model on
free loopback ports (started once per test session, concurrently, stopped by PID), and a
Switchyard gateway in front of them; and `agent_engine`, one server per engine with the whole
context and tool calling that the coding-agent CLIs' prompts need, shared by their tests.

An engine is skipped only when its install step has not run (`python -m engines.install
llamacpp|vllm`, which `make test` runs first).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from engines import install
from engines.launch import ServerProcess, start_llamacpp, start_vllm

MODEL = "smollm2-135m-instruct"
CONTEXT = 2048  # tokens per request on both engines: vLLM --max-model-len, llama.cpp -c 4096 -np 2
PROXY_MODULES = ("plugins.proxy.vllm", "plugins.proxy.llamacpp", "plugins.proxy.openai_compatible")
ENGINES = ("llamacpp", "vllm")
INSTALL_HINT = {"llamacpp": "python -m engines.install llamacpp", "vllm": "python -m engines.install vllm"}
INSTALLED_CHECK = {"llamacpp": install.llamacpp_installed, "vllm": install.vllm_installed}


def public_name(engine: str) -> str:
    return f"smol-{engine}"


# For working on the tests: point at servers you already run (same flags as `_start`).
EXTERNAL_ENV = {"llamacpp": "SWITCHYARD_TEST_LLAMACPP_URL", "vllm": "SWITCHYARD_TEST_VLLM_URL"}


class External:
    """An engine server this session did not start (and so does not stop)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def stop(self) -> None:
        pass


def _installed(engine: str) -> bool:
    if os.environ.get(EXTERNAL_ENV[engine]):
        return True
    return install.llamacpp_installed() if engine == "llamacpp" else install.vllm_installed()


def _start(engine: str, log_dir: Path) -> ServerProcess | External:
    if os.environ.get(EXTERNAL_ENV[engine]):
        return External(os.environ[EXTERNAL_ENV[engine]])
    if engine == "llamacpp":
        # one thread: on a 2-core machine shared with other jobs, two spinning OpenMP threads
        # collapse to ~5 tokens/s whenever a core is taken (measured); one thread stays at 40-80
        return start_llamacpp(alias=MODEL, ctx_size=2 * CONTEXT, parallel=2, threads=1, log_dir=log_dir)
    return start_vllm(served_model_names=[MODEL], max_model_len=CONTEXT, enforce_eager=True, kv_cache_space_gib=1,
                      log_dir=log_dir, timeout=float(os.environ.get("SWITCHYARD_VLLM_START_TIMEOUT", "420")))


@pytest.fixture(scope="session")
def engine_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    log_dir = tmp_path_factory.mktemp("engine-logs")
    wanted = [e for e in ENGINES if _installed(e)]
    started: dict[str, ServerProcess] = {}
    errors: list[BaseException] = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {engine: pool.submit(_start, engine, log_dir) for engine in wanted}
        for engine, future in futures.items():
            try:
                started[engine] = future.result()
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
    if errors:
        for server in started.values():
            server.stop()
        raise errors[0]
    try:
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest, engine_servers: dict[str, ServerProcess]) -> str:
    name = request.param
    if name not in engine_servers:
        pytest.skip(f"{name} is not installed; run `{INSTALL_HINT[name]}`")
    return name


AGENT_CONTEXT = 8192  # the default model's whole context: Codex's prompt is ~4,600 tokens, Claude Code's ~4,100


def _start_for_agents(engine: str, log_dir: Path) -> ServerProcess:
    """Tool calling on: `llama-server --jinja`, vLLM's hermes parser. llama-server is up in ~2 s,
    vLLM (CPU) in ~60 s."""
    if engine == "llamacpp":
        return start_llamacpp(alias=MODEL, ctx_size=AGENT_CONTEXT, parallel=1, threads=1, extra=["--jinja"],
                              log_dir=log_dir)
    return start_vllm(served_model_names=[MODEL], max_model_len=AGENT_CONTEXT, enforce_eager=True,
                      kv_cache_space_gib=1, extra=["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
                      log_dir=log_dir, timeout=float(os.environ.get("SWITCHYARD_VLLM_START_TIMEOUT", "600")))


@pytest.fixture(scope="session", params=ENGINES)
def agent_engine(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ServerProcess]]:
    """(engine, server) for the agent CLIs' tests (test_codex_real.py, test_claude_code_real.py):
    session-scoped so that pytest runs every test of one engine, of both files, on one server,
    then stops it before starting the next engine's (vLLM's start is the minute that counts); the
    last engine's server stays until the session ends."""
    name = request.param
    if not INSTALLED_CHECK[name]():
        pytest.skip(f"{name} is not installed; run `{INSTALL_HINT[name]}`")
    server = _start_for_agents(name, tmp_path_factory.mktemp(f"{name}-agent-logs"))
    try:
        yield name, server
    finally:
        server.stop()


def gateway_config(servers: dict[str, ServerProcess], *, builtin: bool = False) -> str:
    from plugins.manager import BUILTIN_PLUGINS

    modules = [m for m in PROXY_MODULES if m not in BUILTIN_PLUGINS.values()]
    lines = ["[plugins]", f"modules = {json.dumps(modules)}"]
    if not builtin:
        lines.append('disable = ["builtin"]')
    lines.append("")
    for engine, server in servers.items():
        lines += [
            "[[backends]]", f'name = "{engine}"', f'type = "{engine}"', "[backends.options]",
            f'base_url = "{server.base_url}"', f'models = {{ "{public_name(engine)}" = "{MODEL}" }}', "",
        ]
    if builtin:
        lines += [
            "[[backends]]", 'name = "builtin"', 'type = "builtin"', "[backends.options]",
            f'model = "{MODEL}"', f'served_model_name = "{public_name("builtin")}"', f"max_model_len = {CONTEXT}",
            "num_threads = 1", "",
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def gateway_url(engine_servers: dict[str, ServerProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.support.server import running_server

    if not engine_servers:
        pytest.skip("no engine installed; run `python -m engines.install llamacpp` / `vllm`")
    with running_server(gateway_config(engine_servers), tmp_path_factory.mktemp("gateway")) as base:
        yield base
