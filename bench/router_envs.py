"""The peers' fleet routers for `bench/fleet_routing.py`, each pinned and installed once per
machine into a venv of its own:

    python bench/router_envs.py install     # ~/.cache/switchyard/bench/<name>-<version>/venv
    python bench/router_envs.py status

- `sglang-router` (SGLang's router: policies `cache_aware` — an approximate radix tree of the
  request text per worker — `round_robin`, `power_of_two`, ...), started as
  `python -m sglang_router.launch_router --worker-urls ... --policy ...`.
- `vllm-router` (vLLM's fork of it), started as `vllm-router --worker-urls ... --policy ...`.

Both are Rust binaries in manylinux wheels from PyPI; nothing else is fetched. They run on
loopback in front of the bench's own llama.cpp replicas only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MARKER = "switchyard-bench.json"


@dataclass(frozen=True)
class Router:
    name: str
    version: str
    command: tuple[str, ...]  # relative to the venv's bin/: how to start it
    quiet: str  # its --log-level for warnings and errors only
    metrics_port_flag: str | None = None  # the flag that moves its metrics exporter's port

    @property
    def home(self) -> Path:
        env = os.environ.get("SWITCHYARD_CACHE")
        root = Path(env).expanduser() if env else Path.home() / ".cache" / "switchyard"
        return root / "bench" / f"{self.name}-{self.version}"

    @property
    def bin(self) -> Path:
        return self.home / "venv" / "bin"

    def installed(self) -> bool:
        return (self.home / MARKER).is_file()

    def argv(self, port: int, workers: list[str], policy: str) -> list[str]:
        first, *rest = self.command
        argv = [str(self.bin / first), *rest, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
                "--policy", policy, "--log-level", self.quiet]
        if self.metrics_port_flag:  # its Prometheus exporter on a free port, not a fixed one another router may hold
            argv += [self.metrics_port_flag, str(_free_port())]
        return argv

    def install(self) -> None:
        if self.installed():
            return
        self.home.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(self.home / "venv")], check=True)
        subprocess.run([str(self.bin / "pip"), "install", "--quiet", f"{self.name}=={self.version}"], check=True)
        (self.home / MARKER).write_text(json.dumps({"name": self.name, "version": self.version}))


ROUTERS = {
    "sglang-router": Router("sglang-router", "0.3.2", ("python", "-m", "sglang_router.launch_router"), "warn", "--prometheus-port"),
    "vllm-router": Router("vllm-router", "0.1.17", ("vllm-router",), "warning"),
}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    command = (argv if argv is not None else sys.argv[1:] or ["status"])[0]
    for router in ROUTERS.values():
        if command == "install":
            router.install()
        print(f"{router.name} {router.version}: {'installed' if router.installed() else 'not installed'} ({router.home})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
