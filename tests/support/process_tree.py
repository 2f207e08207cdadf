"""A real `switchyard serve` process tree for the worker and engine process tests: the server's
parent, its workers and its engine process, found by their command lines."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from tests.support.server import server_process


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
    with server_process(config_text, tmp_dir, ready_timeout=ready_timeout, stop_timeout=30.0) as (proc, base, log):
        yield Server(proc, base, log)
