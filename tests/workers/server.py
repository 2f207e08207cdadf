"""A real `switchyard serve` process tree for the worker and engine process tests: the server's
parent, its workers and its engine process, found by their command lines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from tests.support.server import ROOT, _wait_ready, free_port


@dataclass
class Server:
    proc: subprocess.Popen
    base: str
    log: Path

    def children(self, module: str) -> list[psutil.Process]:
        """The live processes under the server running `python -m <module>`."""
        found = []
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if module in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                    found.append(child)
            except psutil.NoSuchProcess:
                pass
        return found

    def metrics(self) -> str:
        return httpx.get(self.base + "/metrics", timeout=10).text

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def serving(config_text: str, tmp_dir: Path, *, ready_timeout: float = 120.0) -> Iterator[Server]:
    """Serve `config_text` on a free port until the block ends (SIGTERM, then kill)."""
    config = tmp_dir / "plugins.toml"
    config.write_text(config_text)
    port = free_port()
    log_path = tmp_dir / f"server-{port}.log"
    log = log_path.open("wb")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    server = Server(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        _wait_ready(proc, server.base, ready_timeout, str(log_path))
        yield server
    finally:
        tree = []
        try:
            tree = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for child in tree:  # nothing the server started may outlive it
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        log.close()
