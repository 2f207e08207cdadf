"""The arms of the gateway benchmarks, each a server the client can reach on loopback:

- `direct`: the bench upstream itself (bench/upstream.py), no gateway;
- `switchyard`: a Switchyard server whose one `openai_compatible` backend points at it;
- `litellm`: LiteLLM's proxy (its own venv, bench/litellm_env.py) with one `openai/` model
  pointing at it;
- `nginx`: nginx relaying the stream unparsed (bench/nginx_env.py): the floor, what a proxy in C
  pays for the same sockets.

`switchyard-2w` / `litellm-2w` / `nginx-2w` (any `-<N>w`): the same gateway with N worker
processes (`[server] workers = N`, LiteLLM's `--num_workers N`, nginx's `worker_processes N`).

`start_arms()` starts the upstream and the requested gateways; `Arm.pid` is the process whose
CPU and RSS are the gateway's cost (None for direct).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench import litellm_env, nginx_env
from bench.common import ROOT, Server, dist_version, free_port, spawn, wait_ready

MODEL = "bench-model"


@dataclass
class Arm:
    name: str
    port: int
    path: str  # chat completions path
    headers: dict[str, str]
    server: Server | None  # the gateway process (None: direct)
    version: str | None = None

    @property
    def pid(self) -> int | None:
        return self.server.pid if self.server is not None else None


def start_upstream(log_dir: Path, *, tokens: int, pace_ms: float, uvloop: bool = True) -> Server:
    port = free_port()
    argv = [sys.executable, str(ROOT / "bench" / "upstream.py"), "--port", str(port), "--tokens", str(tokens),
            "--pace-ms", str(pace_ms)]
    if not uvloop:
        argv.append("--no-uvloop")
    server = spawn("upstream", argv, port=port, log_dir=log_dir)
    wait_ready(server, "/health", timeout=30)
    return server


def arm_name(base: str, workers: int) -> str:
    return base if workers == 1 else f"{base}-{workers}w"


def parse_arm(name: str) -> tuple[str, int]:
    """("switchyard", 2) for "switchyard-2w"."""
    base, _, suffix = name.partition("-")
    return base, int(suffix[:-1]) if suffix.endswith("w") else 1


def upstream_backend(upstream_port: int) -> str:
    """The `[[backends]]` table of Switchyard's backend on the bench upstream."""
    return f"""[[backends]]
name = "upstream"
type = "openai_compatible"
[backends.options]
base_url = "http://127.0.0.1:{upstream_port}"
models = {{ "{MODEL}" = "{MODEL}" }}
"""


def switchyard_config(upstream_port: int, *, keepalive: int | None = None, workers: int = 1) -> str:
    pool = ""
    if keepalive is not None:
        pool = f"[backends.options.pool]\nmax_keepalive_connections = {keepalive}\n"
    more = f"workers = {workers}\n" if workers != 1 else ""  # key_limits_overhead adds keys after log_level
    return f"""[server]
log_level = "warning"
{more}
[plugins]
disable = ["builtin"]

{upstream_backend(upstream_port)}{pool}"""


def start_switchyard(log_dir: Path, upstream_port: int, *, keepalive: int | None = None, workers: int = 1,
                     tree: Path | None = None, name: str | None = None) -> Server:
    """`switchyard serve` in front of the upstream; `tree`: the source tree it runs from (its
    working directory, so `python -m gateway.cli` imports that tree's code), this one by default."""
    port = free_port()
    name = name or arm_name("switchyard", workers)
    config = log_dir / f"{name}.toml"
    config.write_text(switchyard_config(upstream_port, keepalive=keepalive, workers=workers))
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--host", "127.0.0.1",
            "--port", str(port), "--drain-seconds", "1"]
    server = spawn(name, argv, port=port, log_dir=log_dir, cwd=tree.resolve() if tree is not None else None)
    wait_ready(server, "/health", timeout=90)
    return server


def start_litellm(log_dir: Path, upstream_port: int, *, workers: int = 1) -> tuple[Server, str]:
    cfg = litellm_env.write_config(log_dir, model=MODEL, upstream_base=f"http://127.0.0.1:{upstream_port}/v1")
    port = free_port()
    server = spawn(arm_name("litellm", workers), litellm_env.server_argv(cfg.path, port, workers=workers), port=port,
                   log_dir=log_dir, env=litellm_env.offline_env(), cwd=log_dir)
    wait_ready(server, "/health/liveliness", timeout=180)
    return server, cfg.master_key


def start_nginx(log_dir: Path, upstream_port: int, *, workers: int = 1, name: str | None = None) -> Server:
    port = free_port()
    name = name or arm_name("nginx", workers)
    config = nginx_env.write_config(log_dir / name, port=port, upstream_port=upstream_port, workers=workers)
    server = spawn(name, nginx_env.server_argv(config), port=port, log_dir=log_dir, cwd=log_dir)
    wait_ready(server, "/health", timeout=30)  # (the upstream's, through nginx)
    return server


def switchyard_version() -> str:
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return dist_version("switchyard") or "unknown"
    return f"git {head}{'+dirty' if dirty else ''}" if head else (dist_version("switchyard") or "unknown")


def arm_versions() -> dict[str, str | None]:
    return {
        "switchyard": switchyard_version(),
        "litestar": dist_version("litestar"),
        "uvicorn": dist_version("uvicorn"),
        "httpx": dist_version("httpx"),
        "msgspec": dist_version("msgspec"),
        "litellm": litellm_env.version(),
        "nginx": nginx_env.version(),
    }


@contextmanager
def started_arms(names: list[str], *, tokens: int, pace_ms: float, log_dir: Path | None = None,
                 upstream_uvloop: bool = True, keepalive: int | None = None) -> Iterator[tuple[Server, dict[str, Arm]]]:
    """Start the upstream and the named arms (direct, switchyard, litellm, nginx); stop all on
    exit. An arm that cannot start (litellm or nginx not installed) is left out with a message."""
    with ExitStack() as stack:
        if log_dir is None:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-arms-")))
        upstream = start_upstream(log_dir, tokens=tokens, pace_ms=pace_ms, uvloop=upstream_uvloop)
        stack.callback(upstream.stop)
        arms: dict[str, Arm] = {}
        for name in names:
            base, workers = parse_arm(name)
            if name == "direct":
                arms[name] = Arm("direct", upstream.port, "/v1/chat/completions", {}, None, None)
            elif base == "switchyard":
                server = start_switchyard(log_dir, upstream.port, keepalive=keepalive, workers=workers)
                stack.callback(server.stop)
                arms[name] = Arm(name, server.port, "/v1/chat/completions", {}, server, switchyard_version())
            elif base == "litellm":
                if not litellm_env.installed():
                    print(f"SKIPPED {name} arm: not installed (python bench/litellm_env.py install; "
                          f"litellm {litellm_env.LITELLM_VERSION})", flush=True)
                    continue
                server, key = start_litellm(log_dir, upstream.port, workers=workers)
                stack.callback(server.stop)
                arms[name] = Arm(name, server.port, "/v1/chat/completions",
                                 {"authorization": f"Bearer {key}"}, server, litellm_env.version())
            elif base == "nginx":
                if not nginx_env.installed():
                    print(f"SKIPPED {name} arm: not installed (python -m engines.install nginx)", flush=True)
                    continue
                server = start_nginx(log_dir, upstream.port, workers=workers)
                stack.callback(server.stop)
                arms[name] = Arm(name, server.port, "/v1/chat/completions", {}, server, nginx_env.version())
            else:
                raise ValueError(f"unknown arm {name}")
        yield upstream, arms
