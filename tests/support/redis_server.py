"""A real `redis-server` process on a free loopback port, for the shared-state tests.

Debian's redis-server, installed by `python -m engines.install redis` (part of `make engines`);
tests skip with that hint when it is missing. No persistence: every start is empty.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support.server import free_port

INSTALL_HINT = "python -m engines.install redis"


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 20.0) -> None:
        """Start (or restart, on the same port) and wait until it answers PING."""
        binary = shutil.which("redis-server")
        assert binary is not None, f"redis-server is not installed; run `{INSTALL_HINT}`"
        log = (self.workdir / f"redis-{self.port}.log").open("ab")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir), "--protected-mode", "yes"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}; log in {self.workdir}")
            if self.ping():
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer PING within {timeout} s")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def command(self, *args: str) -> bytes:
        """One command in RESP, its raw reply (for FLUSHALL and friends)."""
        payload = f"*{len(args)}\r\n".encode() + b"".join(f"${len(a.encode())}\r\n{a}\r\n".encode() for a in args)
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as conn:
            conn.sendall(payload)
            return conn.recv(65536)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def redis_installed() -> bool:
    return shutil.which("redis-server") is not None
