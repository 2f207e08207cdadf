"""`switchyard new-plugin` output, installed with pip into a scratch venv, is found through its
entry point, passes `switchyard plugin-check` and its own conformance test, and serves the
official `openai` client."""

from __future__ import annotations

import subprocess
from pathlib import Path

import openai

from gateway.cli.scaffold import write_package
from plugins.testing import CHECKS
from tests.support.plugin_kit import pip_install, scratch_venv
from tests.support.server import running_server

CONFIG = """\
[server]
health_interval_s = 0

[[backends]]
name = "shout"
type = "shout"
[backends.options]
model = "shout-1"
"""


def test_the_scaffold_installs_passes_plugin_check_and_serves(tmp_path: Path) -> None:
    package = write_package("shout", tmp_path / "src")
    python = scratch_venv(tmp_path / "venv")
    pip_install(python, str(package))
    (tmp_path / "plugins.toml").write_text(CONFIG)

    check = subprocess.run([python, "-m", "gateway.cli", "plugin-check", "--backend", "shout"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("\nPASS  ") == len(CHECKS)

    (tmp_path / "twice.toml").write_text('[plugins]\nmodules = ["switchyard_shout.plugin"]\n' + CONFIG)
    named_too = subprocess.run([python, "-m", "gateway.cli", "check-config", "twice.toml"], cwd=tmp_path,
                               capture_output=True, text=True)
    assert named_too.returncode == 0, named_too.stderr  # installed and named in [plugins] modules: loaded once

    own = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(package)], cwd=package,
                         capture_output=True, text=True, timeout=300)
    assert own.returncode == 0, own.stdout + own.stderr
    assert f"{len(CHECKS)} passed" in own.stdout

    with running_server(CONFIG, tmp_path, python=python) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["shout-1"]
        reply = client.chat.completions.create(model="shout-1", messages=[{"role": "user", "content": "all aboard now"}])
        assert reply.choices[0].message.content == "all aboard now"
        assert reply.usage.prompt_tokens == 4 and reply.usage.completion_tokens == 3
        stream = client.chat.completions.create(model="shout-1", messages=[{"role": "user", "content": "a b c d"}],
                                                stream=True, max_tokens=2)
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "a b"
        assert chunks[-1].choices[0].finish_reason == "length"
