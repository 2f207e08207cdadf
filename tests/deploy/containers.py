"""Real containers of the real image for the deploy tests: podman run, logs, SIGTERM, exit codes.

Every container shares the host's network (`--network host`) and listens on a loopback port of
its own: the tests then talk to 127.0.0.1 only, and two containers can share one port the way
two pods share a Service (SO_REUSEPORT, which the gateway's worker mode sets).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from deploy.podman import podman

CONTAINER_CONFIG = "/etc/switchyard/plugins.toml"


@dataclass
class Container:
    name: str
    port: int
    started_at: float = field(default_factory=time.monotonic)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        got = podman("logs", self.name, check=False)
        return (got.stdout + got.stderr).decode(errors="replace")

    def state(self) -> dict:
        got = podman("inspect", "--format", "{{json .State}}", self.name, check=False)
        return json.loads(got.stdout) if got.returncode == 0 else {}

    def running(self) -> bool:
        return bool(self.state().get("Running"))

    def signal(self, sig: str = "TERM") -> None:
        podman("kill", "--signal", sig, self.name)

    def wait_exit(self, timeout: float) -> int:
        """The container's exit code once it stopped by itself within `timeout` s (else it is
        killed and this raises)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state()
            if state and not state.get("Running"):
                return int(state["ExitCode"])
            time.sleep(0.1)
        podman("kill", "--signal", "KILL", self.name, check=False)
        raise AssertionError(f"{self.name} did not exit within {timeout} s:\n{self.logs()[-3000:]}")

    def start_again(self) -> None:
        self.started_at = time.monotonic()
        podman("start", self.name)

    def remove(self) -> None:
        podman("rm", "--force", "--volumes", "--time", "0", self.name, check=False)

    def wait_ready(self, timeout: float, *, log_marker: str | None = None, markers: int = 1) -> float:
        """Seconds from start until GET /ready answered 200 (and, where several containers share
        the port, until this one's log shows `log_marker` `markers` times since its start)."""
        deadline = self.started_at + timeout
        with httpx.Client(timeout=5) as client:
            while time.monotonic() < deadline:
                if not self.running():
                    raise AssertionError(f"{self.name} exited: {self.state()}\n{self.logs()[-4000:]}")
                mine = log_marker is None or self.logs().count(log_marker) >= markers
                try:
                    if mine and client.get(f"{self.base}/ready").status_code == 200:
                        return time.monotonic() - self.started_at
                except httpx.HTTPError:
                    pass
                time.sleep(0.25)
        raise AssertionError(f"{self.name} not ready within {timeout} s:\n{self.logs()[-4000:]}")


def run_container(image: str, port: int, *, config: Path | None = None, extra: tuple[str, ...] = (),
                  args: tuple[str, ...] = ()) -> Container:
    """`podman run -d` the image as it ships: its entrypoint (`switchyard serve --config
    /etc/switchyard/plugins.toml`), a read-only root filesystem, the host's network; `config`
    is mounted over the image's plugins.toml."""
    name = f"switchyard-test-{uuid.uuid4().hex[:10]}"
    cmd = ["run", "-d", "--name", name, "--network", "host", "--read-only"]
    if config is not None:
        config.chmod(0o644)
        cmd += ["-v", f"{config}:{CONTAINER_CONFIG}:ro"]
    container = Container(name=name, port=port)
    podman(*cmd, *extra, image, "--host", "127.0.0.1", "--port", str(port), *args)
    return container


def in_image(image: str, *command: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run a command in a throw-away container of the image (its entrypoint replaced)."""
    return podman("run", "--rm", "--network", "none", *extra, "--entrypoint", command[0], image, *command[1:],
                  check=False, timeout=300)
