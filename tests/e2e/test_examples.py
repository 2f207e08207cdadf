"""The example packages in examples/, as a third party ships them: each built as a wheel,
installed with pip into a scratch venv, found through its entry point, served through
`switchyard serve` to the official `openai` client, and switched off by name."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.plugin_kit import pip_install, scratch_venv
from tests.support.server import ROOT, running_server

EXAMPLES = ROOT / "examples"
PACKAGES = ("switchyard-transformers", "switchyard-smooth-weighted")
FAST_CHECKS = ("lifecycle", "event_grammar", "max_tokens", "stop_strings", "cancellation", "errors", "close")

SERVED = """\
[server]
health_interval_s = 0

[plugins]
modules = ["tests.support.echo_backend"]

[[backends]]
name = "hf"
type = "transformers"
[backends.options]
max_model_len = 2048
num_threads = 1

[[backends]]
name = "echo-a"
type = "echo"
[backends.options]
answer_prefix = "A"

[[backends]]
name = "echo-b"
type = "echo"
[backends.options]
answer_prefix = "B"

[[routes]]
name = "lanes"
strategy = "smooth_weighted"
[[routes.targets]]
backend = "echo-a"
model = "echo-1"
weight = 2
[[routes.targets]]
backend = "echo-b"
model = "echo-1"
weight = 1
"""


def gateway_cli(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`switchyard ARGS` in the scratch venv (with this checkout on the path for the echo backend)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([python, "-m", "gateway.cli", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch venv with both examples installed from wheels built here."""
    work = tmp_path_factory.mktemp("examples")
    wheels = work / "dist"
    for name in PACKAGES:
        source = shutil.copytree(EXAMPLES / name, work / name)  # setuptools builds in the tree: not in ours
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "--wheel-dir", str(wheels), str(source)], check=True)
    python = scratch_venv(work / "venv")
    pip_install(python, *map(str, sorted(wheels.glob("*.whl"))))
    return python


def test_examples_import_only_the_public_api() -> None:
    for path in EXAMPLES.rglob("*.py"):
        text = path.read_text()
        assert "from plugins" not in text and "import plugins" not in text, path


def test_the_wheels_register_their_entry_points(venv_python: Path) -> None:
    code = "import importlib.metadata as m; print(sorted(e.name for e in m.entry_points(group='switchyard')))"
    listed = subprocess.run([venv_python, "-c", code], capture_output=True, text=True, check=True).stdout
    assert listed.strip() == "['smooth_weighted', 'transformers']"
    assert not importlib.metadata.entry_points(group="switchyard")  # only the scratch venv has them


def test_the_transformers_backend_passes_plugin_check(venv_python: Path, tmp_path: Path) -> None:
    (tmp_path / "plugins.toml").write_text(SERVED)
    args = [arg for name in FAST_CHECKS for arg in ("--check", name)]
    done = gateway_cli(venv_python, "plugin-check", "--backend", "hf", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("\nPASS  ") == len(FAST_CHECKS)


def test_served_through_the_gateway(venv_python: Path, tmp_path: Path) -> None:
    with running_server(SERVED, tmp_path, python=venv_python) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
        france = [{"role": "user", "content": "What is the capital of France?"}]
        raw = client.chat.completions.with_raw_response.create(model="smollm2-135m-instruct", temperature=0,
                                                               max_tokens=16, messages=france)
        assert raw.headers["x-switchyard-backend"] == "hf"
        reply = raw.parse()
        assert "Paris" in reply.choices[0].message.content
        counted = httpx.post(base + "/tokenize", json={"model": "smollm2-135m-instruct", "messages": france}).json()
        assert reply.usage.prompt_tokens == counted["count"] and reply.usage.completion_tokens >= 1
        stream = client.chat.completions.create(model="smollm2-135m-instruct", temperature=0, max_tokens=4, stream=True,
                                                messages=[{"role": "user", "content": "Tell me a story."}])
        chunks = [c for c in stream if c.choices]
        assert chunks[-1].choices[0].finish_reason == "length"
        assert "".join(c.choices[0].delta.content or "" for c in chunks).strip()

        served_by = [httpx.post(base + "/v1/chat/completions", json={
            "model": "lanes", "messages": [{"role": "user", "content": "hi"}]}).headers["x-switchyard-backend"]
            for _ in range(6)]
        assert served_by == ["echo-a", "echo-b", "echo-a"] * 2  # smooth: 2:1, interleaved


@pytest.mark.parametrize(("disabled", "error"), [
    ("transformers", "unknown backend type 'transformers' at `backends[0].type`"),
    ("smooth_weighted", "unknown routing strategy 'smooth_weighted' at `routes[0].strategy`"),
])
def test_disabled_by_name(venv_python: Path, tmp_path: Path, disabled: str, error: str) -> None:
    config = SERVED.replace('[plugins]\n', f'[plugins]\ndisable = ["{disabled}"]\n')
    (tmp_path / "plugins.toml").write_text(config)
    done = gateway_cli(venv_python, "check-config", cwd=tmp_path)
    assert done.returncode == 2
    assert error in done.stderr
