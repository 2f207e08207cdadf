"""`python -m engines.install` and `switchyard engines install`, run as a user runs them
(subprocesses): `status` says as JSON what is installed where, by the cache's markers, and installs
nothing; a choice the command does not know exits 2 naming those it does, the same on both."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engines.install.cli import CHOICES
from engines.install.kubectl import KUBECTL_VERSION

ROOT = Path(__file__).resolve().parents[3]
STEPS = ("llamacpp", "vllm", "gguf", "redis", "nginx", "kubectl", "podman", "claude-code", "codex")
COMMANDS = {"python -m engines.install": ["engines.install"],
            "switchyard engines install": ["gateway.cli", "engines", "install"]}


def run(command: list[str], *args: str, cache: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The command with this environment, less the SWITCHYARD_ overrides when `cache` is given."""
    env = dict(os.environ)
    if cache is not None:
        env = {key: value for key, value in env.items() if not key.startswith("SWITCHYARD_")}
        env["SWITCHYARD_CACHE"] = str(cache)
    return subprocess.run([sys.executable, "-m", *command, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def status(cache: Path) -> dict[str, dict[str, object]]:
    done = run(COMMANDS["python -m engines.install"], "status", cache=cache)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_status_of_an_empty_cache_names_every_step_and_where_it_would_go(tmp_path: Path) -> None:
    body = status(tmp_path)
    assert set(body) == {"engines_root", "agents_root", *STEPS}
    assert body["engines_root"] == str(tmp_path / "engines")
    assert body["agents_root"] == str(tmp_path / "agents")
    paths = {"llamacpp": body["llamacpp"]["llama_server"], "vllm": body["vllm"]["python"], "gguf": body["gguf"]["path"],
             "kubectl": body["kubectl"]["path"]}
    for step, path in paths.items():
        assert body[step]["installed"] is False, step
        assert Path(path).is_relative_to(tmp_path / "engines"), (step, path)
    for agent in ("claude-code", "codex"):
        assert body[agent]["installed"] is False
        assert Path(body[agent]["path"]).is_relative_to(tmp_path / "agents")
    assert list(tmp_path.iterdir()) == [], "status wrote into the cache"


def test_status_counts_a_step_installed_once_its_marker_is_written(tmp_path: Path) -> None:
    folder = tmp_path / "engines" / f"kubectl-{KUBECTL_VERSION}"
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "kubectl").write_bytes(b"")
    assert status(tmp_path)["kubectl"] == {"installed": False, "path": str(folder / "bin" / "kubectl")}
    (folder / "switchyard-engine.json").write_text("{}")
    assert status(tmp_path)["kubectl"] == {"installed": True, "path": str(folder / "bin" / "kubectl")}


def test_both_commands_report_this_machine_alike() -> None:
    reports = []
    for command in COMMANDS.values():
        done = run(command, "status")
        assert done.returncode == 0, done.stderr
        reports.append(json.loads(done.stdout))
    assert reports[0] == reports[1]
    assert all(isinstance(reports[0][step]["installed"], bool) for step in STEPS)


@pytest.mark.parametrize("name", COMMANDS)
def test_an_unknown_choice_exits_2_naming_the_choices(name: str) -> None:
    done = run(COMMANDS[name], "everything")
    assert done.returncode == 2
    assert done.stdout == ""
    listed = re.search(r"invalid choice: 'everything' \(choose from (.*)\)", done.stderr)
    assert listed is not None, done.stderr
    assert tuple(re.findall(r"'([^']+)'", listed[1])) == CHOICES
