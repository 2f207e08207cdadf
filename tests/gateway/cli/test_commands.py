"""`switchyard plugin-check`, the pytest plugin's command-line form and `switchyard new-plugin`,
run as a user runs them (subprocesses) against the scaffold's package and a broken copy of it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli.scaffold import write_package
from plugins.contract.errors import ConfigError
from plugins.testing import CHECKS
from tests.support.server import ROOT

CONFIG = """\
[plugins]
modules = ["switchyard_{name}.plugin"]

[[backends]]
name = "mine"
type = "{name}"
"""


def run(args: list[str], package: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package), str(ROOT)])}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def broken_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scaffold whose backend finishes every choice twice."""
    package = write_package("twice", tmp_path_factory.mktemp("broken"))
    plugin = package / "switchyard_twice" / "plugin.py"
    source = plugin.read_text()
    once = "                yield Finish(reason=reason, index=index)\n"
    assert once in source
    plugin.write_text(source.replace(once, once * 2))
    return package


def test_plugin_check_passes_the_scaffold(toy_package: Path, tmp_path: Path) -> None:
    (tmp_path / "plugins.toml").write_text(CONFIG.format(name="toy"))
    done = run(["-m", "gateway.cli", "plugin-check", "--backend", "mine"], toy_package, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "plugin-check: backend `mine` (type `toy`) from plugins.toml"
    assert [line.split()[:2] for line in lines[1:-1]] == [["PASS", name] for name in CHECKS]
    assert lines[-1] == f"{len(CHECKS)} checks: {len(CHECKS)} passed, 0 failed, 0 skipped"


def test_plugin_check_names_the_failure_shows_the_events_and_exits_1(broken_package: Path, tmp_path: Path) -> None:
    (tmp_path / "plugins.toml").write_text(CONFIG.format(name="twice"))
    done = run(["-m", "gateway.cli", "plugin-check", "plugins.toml", "--backend", "mine"], broken_package, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "FAIL  event_grammar   chat, stream, n=1: choice 0 has 2 Finish events; exactly one is expected" in out
    assert f"fix: {CHECKS['event_grammar'].fix[:40]}" in out
    assert "chat, stream, n=1 (" in out and out.count("Finish[0] stop") == 2  # the events it saw
    assert "PASS  concurrency" in out and out.rstrip().endswith("1 failed, 0 skipped")


def test_plugin_check_refuses_an_unknown_backend_name(toy_package: Path, tmp_path: Path) -> None:
    (tmp_path / "plugins.toml").write_text(CONFIG.format(name="toy"))
    done = run(["-m", "gateway.cli", "plugin-check", "--backend", "nope"], toy_package, tmp_path)
    assert done.returncode == 2
    assert "no [[backends]] table is named 'nope' (backends: mine)" in done.stderr
    done = run(["-m", "gateway.cli", "plugin-check", "--backend", "mine", "--check", "usage", "--check", "nope"],
               toy_package, tmp_path)
    assert done.returncode == 2 and "unknown check(s) nope (known: lifecycle," in done.stderr, done.stderr
    assert "plugin-check:" not in done.stdout  # refused before the backend starts


def test_pytest_plugin_one_test_per_check(toy_package: Path, broken_package: Path, tmp_path: Path) -> None:
    args = ["-m", "pytest", "-p", "switchyard.testing", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "-q"]
    done = run([*args, "--switchyard-backend=toy", "--switchyard-module=switchyard_toy.plugin",
                '--switchyard-options={"token_delay_s": 0.001}'], toy_package, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(CHECKS)} passed" in done.stdout

    done = run([*args, "--switchyard-backend=twice", "--switchyard-module=switchyard_twice.plugin", "-rf"],
               broken_package, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"1 failed, {len(CHECKS) - 1} passed" in done.stdout
    assert "FAILED switchyard::event_grammar" in done.stdout
    assert "choice 0 has 2 Finish events" in done.stdout and "Finish[0] stop" in done.stdout

    done = run([*args, "--switchyard-backend=toy", "--switchyard-module=switchyard_toy.plugin",
                "--switchyard-check=nope"], toy_package, tmp_path)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "--switchyard-check: unknown check(s) nope" in done.stderr


def test_new_plugin_command(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "new-plugin", "my_engine", "--dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    root = tmp_path / "switchyard-my-engine"
    assert (root / "switchyard_my_engine" / "plugin.py").is_file()
    assert 'my_engine = "switchyard_my_engine.plugin"' in (root / "pyproject.toml").read_text()
    assert "class MyEngineBackend" in (root / "switchyard_my_engine" / "plugin.py").read_text()
    for path in root.rglob("*.py"):  # only the public import, never the generic `plugins` package
        assert "from plugins" not in path.read_text() and "import plugins" not in path.read_text(), path
    again = subprocess.run([sys.executable, "-m", "gateway.cli", "new-plugin", "my_engine", "--dir", str(tmp_path)],
                           cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 2 and "exists already" in again.stderr


@pytest.mark.parametrize("name", ["My", "1x", "a-b", ""])
def test_new_plugin_refuses_names_that_are_not_identifiers(name: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="plugin name"):
        write_package(name, tmp_path)
    assert not any(tmp_path.iterdir())
    shutil.rmtree(tmp_path)
