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

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(config_text: str, tmp_dir: Path, *, env: dict[str, str] | None = None, ready_timeout: float = 120.0,
                   python: str | Path = sys.executable) -> Iterator[str]:
    """Write `config_text` as plugins.toml, serve it (with `python`: another venv's interpreter
    serves with that venv's plugins), yield the base URL (`http://127.0.0.1:P`)."""
    config = tmp_dir / "plugins.toml"
    config.write_text(config_text)
    port = free_port()
    log = (tmp_dir / f"server-{port}.log").open("wb")
    proc_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **(env or {})}
    proc = subprocess.Popen(
        [str(python), "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port), "--drain-seconds", "2"],
        cwd=ROOT,
        env=proc_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, base, ready_timeout, log.name)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


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
