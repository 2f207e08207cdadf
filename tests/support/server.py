"""Start a real Switchyard server in a subprocess on a free loopback port, for contract tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server_process(config_text: str, tmp_dir: Path, *, args: tuple[str, ...] = (), env: dict[str, str] | None = None,
                   ready_timeout: float = 120.0, stop_timeout: float = 15.0,
                   python: str | Path = sys.executable) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    """Write `config_text` as plugins.toml and serve it with `switchyard serve ARGS` (with `python`:
    another venv's interpreter serves with that venv's plugins); yield (process, base URL
    `http://127.0.0.1:P`, log path). At the end: SIGTERM, then kill after `stop_timeout`, and
    whatever the server started (workers, engine processes) is killed too."""
    config = tmp_dir / "plugins.toml"
    config.write_text(config_text)
    port = free_port()
    log_path = tmp_dir / f"server-{port}.log"
    proc_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **(env or {})}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(python), "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port), *args],
            cwd=ROOT, env=proc_env, stdout=log, stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(proc, base, ready_timeout, str(log_path))
            yield proc, base, log_path
        finally:
            _stop(proc, stop_timeout)


def _stop(proc: subprocess.Popen, timeout: float) -> None:
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for child in tree:  # nothing the server started may outlive it
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


@contextmanager
def running_server(config_text: str, tmp_dir: Path, *, env: dict[str, str] | None = None, ready_timeout: float = 120.0,
                   python: str | Path = sys.executable) -> Iterator[str]:
    """`server_process` with a 2-second drain; yields the base URL."""
    with server_process(config_text, tmp_dir, args=("--drain-seconds", "2"), env=env, ready_timeout=ready_timeout,
                        python=python) as (_, base, _):
        yield base


def _wait_ready(proc: subprocess.Popen, base: str, timeout: float, log_path: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{Path(log_path).read_text()[-4000:]}")
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server not healthy after {timeout}s:\n{Path(log_path).read_text()[-4000:]}")


def echo_config(**options: object) -> str:
    """A plugins.toml serving the deterministic echo test backend."""
    lines = [
        "[plugins]",
        'disable = ["builtin"]',
        'modules = ["tests.support.echo_backend"]',
        "",
        "[[backends]]",
        'name = "echo"',
        'type = "echo"',
        "[backends.options]",
    ]
    for key, value in options.items():
        lines.append(f"{key} = {_toml(value)}")
    return "\n".join(lines) + "\n"


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)
