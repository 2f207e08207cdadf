"""Start a real engine server on a loopback port, wait until `/health` answers 200, stop it by PID.

Used by the proxy plugins (a backend whose options carry a `launch` table starts its own
server in `start()` and stops it in `close()`), by the proxy tests' session fixtures, and by
`scripts/record_upstreams.py`. Each server runs in its own session (process group) so that
vLLM's engine-core child goes down with it: SIGTERM to the server's PID first, SIGKILL to its
group only if it has not exited in time. If the starting process dies without stopping it,
`engines.reaper` ends the group.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engines import install, reaper


class EngineStartError(Exception):
    """The server exited or did not become healthy; the message carries its log's tail."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    """A started engine server. `stop()` is idempotent."""

    name: str
    proc: subprocess.Popen
    base_url: str
    log_path: Path
    argv: list[str]
    started_s: float = 0.0  # seconds from spawn to healthy
    _log_file: object = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)  # its own group: started with start_new_session
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
        # children left behind in the server's own group (vLLM's engine core) go too
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        reaper.unwatch(self.proc.pid)
        if self._log_file is not None:
            self._log_file.close()  # type: ignore[attr-defined]
            self._log_file = None


def _spawn(name: str, argv: list[str], *, host: str, port: int, env: dict[str, str] | None, log_dir: Path | None,
           nice: int = 0) -> ServerProcess:
    log_dir = Path(log_dir) if log_dir else Path(tempfile.gettempdir())
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}-{port}.log"
    log = open(log_path, "wb")
    log.write(("$ " + shlex.join(argv) + "\n").encode())
    log.flush()
    full_env = {**os.environ, **(env or {})}
    preexec = (lambda: os.nice(nice)) if nice else None
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env,
                            start_new_session=True, preexec_fn=preexec)
    reaper.watch(proc.pid)  # its own session: ended by the reaper if this process dies without `stop()`
    return ServerProcess(name=name, proc=proc, base_url=f"http://{host}:{port}", log_path=log_path, argv=argv,
                         _log_file=log)


def wait_healthy(server: ServerProcess, timeout: float) -> ServerProcess:
    """Poll `/health` until 200; raise EngineStartError (after stopping it) on exit or timeout."""
    spawned = time.monotonic()
    deadline = spawned + timeout
    while True:
        if server.proc.poll() is not None:
            raise EngineStartError(f"{server.name} exited with {server.proc.returncode} before it was healthy; "
                                   f"log {server.log_path}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(server.base_url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    server.started_s = time.monotonic() - spawned
                    return server
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise EngineStartError(f"{server.name} not healthy after {timeout:.0f} s; log {server.log_path}:\n"
                                   f"{server.log_tail()}")
        time.sleep(0.25)


# ------------------------------------------------------------------------------------ llama.cpp


def llamacpp_argv(*, binary: Path, model: Path, host: str, port: int, alias: str | None, ctx_size: int,
                  parallel: int, threads: int, api_key: str | None = None, extra: Sequence[str] = (),
                  embeddings: bool = False) -> list[str]:
    """`embeddings`: an embedding server (`--embeddings`, last-token pooling as the built-in
    engine and vLLM pool decoder models; vectors L2-normalized, llama-server's default): it then
    serves /v1/embeddings and no completions."""
    argv = [str(binary), "-m", str(model), "--host", host, "--port", str(port), "-c", str(ctx_size),
            "-np", str(parallel), "-t", str(threads), "--metrics", "--slots"]
    if embeddings:
        argv += ["--embeddings", "--pooling", "last"]
    if alias:
        argv += ["-a", alias]
    if api_key:
        argv += ["--api-key", api_key]
    return argv + list(extra)


def start_llamacpp(*, model: Path | None = None, alias: str | None = "smollm2-135m-instruct", host: str = "127.0.0.1",
                   port: int = 0, ctx_size: int = 2048, parallel: int = 2, threads: int = 2,
                   api_key: str | None = None, extra: Sequence[str] = (), binary: Path | None = None,
                   log_dir: Path | None = None, timeout: float = 60.0, nice: int = 0,
                   embeddings: bool = False) -> ServerProcess:
    """`llama-server` serving a GGUF (default: the default model's). `-c` is split over `-np`
    slots: the per-request context is ctx_size // parallel."""
    binary = Path(binary) if binary else install.llama_server_path()
    if not binary.is_file():
        raise EngineStartError(f"{binary} not found; run `python -m engines.install llamacpp`")
    model = Path(model) if model else install.install_gguf()
    port = port or free_port(host)
    argv = llamacpp_argv(binary=binary, model=model, host=host, port=port, alias=alias, ctx_size=ctx_size,
                         parallel=parallel, threads=threads, api_key=api_key, extra=extra, embeddings=embeddings)
    return wait_healthy(_spawn("llama-server", argv, host=host, port=port, env=None, log_dir=log_dir, nice=nice), timeout)


# ------------------------------------------------------------------------------------------ vLLM


def vllm_argv(*, python: Path, model: Path, host: str, port: int, served_model_names: Sequence[str],
              max_model_len: int, enforce_eager: bool, dtype: str, api_key: str | None = None,
              extra: Sequence[str] = (), embeddings: bool = False) -> list[str]:
    """`embeddings`: the pooling runner with the model converted to an embedding model
    (`--runner pooling --convert embed`, last-token pooling, normalized): it then serves
    /v1/embeddings and no generation (one vLLM instance runs one runner)."""
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", host,
            "--port", str(port), "--max-model-len", str(max_model_len), "--enable-prompt-tokens-details",
            "--enable-prefix-caching", "--dtype", dtype]
    if embeddings:
        argv += ["--runner", "pooling", "--convert", "embed", "--pooler-config", '{"seq_pooling_type": "LAST"}']
    if served_model_names:
        argv += ["--served-model-name", *served_model_names]
    if enforce_eager:
        argv.append("--enforce-eager")
    if api_key:
        argv += ["--api-key", api_key]
    return argv + list(extra)


def start_vllm(*, model: Path | None = None, served_model_names: Sequence[str] = ("smollm2-135m-instruct",),
               host: str = "127.0.0.1", port: int = 0, max_model_len: int = 2048, enforce_eager: bool = True,
               dtype: str = "bfloat16", kv_cache_space_gib: int = 1, api_key: str | None = None,
               extra: Sequence[str] = (), python: Path | None = None, env: dict[str, str] | None = None,
               log_dir: Path | None = None, timeout: float = 300.0, nice: int = 0,
               embeddings: bool = False) -> ServerProcess:
    """vLLM's OpenAI server from its own venv, serving an HF checkpoint directory (default: the
    default model, converted by builtin_engine.model.store), with prompt-token details and
    prefix caching on."""
    python = Path(python) if python else install.vllm_python()
    if not python.is_file():
        raise EngineStartError(f"{python} not found; run `python -m engines.install vllm`")
    if model is None:
        from builtin_engine.model.store import DEFAULT_MODEL, fetch_model

        model = fetch_model(DEFAULT_MODEL, progress=False)
    port = port or free_port(host)
    argv = vllm_argv(python=python, model=Path(model), host=host, port=port, served_model_names=served_model_names,
                     max_model_len=max_model_len, enforce_eager=enforce_eager, dtype=dtype, api_key=api_key,
                     extra=extra, embeddings=embeddings)
    full_env = {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_space_gib), "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})}
    return wait_healthy(_spawn("vllm", argv, host=host, port=port, env=full_env, log_dir=log_dir, nice=nice), timeout)


def main(argv: list[str] | None = None) -> int:
    """`python -m engines.launch vllm|llamacpp [--port P]`: start one in the foreground until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m engines.launch")
    parser.add_argument("engine", choices=("vllm", "llamacpp"))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--embeddings", action="store_true", help="an embedding server (no generation)")
    args = parser.parse_args(argv)
    if args.engine == "vllm":
        server = start_vllm(port=args.port, max_model_len=args.max_model_len, embeddings=args.embeddings)
    else:
        server = start_llamacpp(port=args.port, ctx_size=args.max_model_len * 2, parallel=2, embeddings=args.embeddings)
    print(f"{server.name} pid {server.pid} healthy in {server.started_s:.1f} s at {server.base_url}; log {server.log_path}",
          flush=True)
    try:
        server.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
