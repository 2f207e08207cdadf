"""`[server] workers = N`: one port served by N worker processes, each with its own event loop,
configuration and plugin manager (`gateway.worker`).

The parent process binds one listening socket per worker on the same port with SO_REUSEPORT,
so the kernel spreads new connections over them evenly, and hands each worker its socket. It
keeps its own copy open: a worker that dies is restarted on the same socket (after a pause
that grows while it keeps dying young), and the connections that arrived meanwhile wait in that
socket's queue instead of being refused. Restarts are counted in
`switchyard_worker_restarts_total{worker}`.

Before the workers start, the parent starts what they share: for each backend whose type has
a `share` (the built-in engine's process), once, and the workers get the options it returns.

`/metrics` of any worker shows the whole server: every process writes its samples into files
in one directory (prometheus-client's multiprocess mode), which a scrape reads together, so
counters of workers that died are kept; gauges add up (in flight) or take the worst (circuit
breakers) over the live workers. The request log stays one JSONL stream because every worker
appends whole lines in single writes (`gateway.observability.request_log`).

SIGTERM (or SIGINT) drains: the parent closes its copies of the sockets, so the port refuses
new connections once the workers close theirs, and sends SIGTERM to every worker, which drains
as a single process does (`gateway.server`); a second signal is passed on too (end requests at
once). When the workers have exited, the shared parts stop, and the parent exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import msgspec

from gateway.config import Config
from gateway.worker import WorkerSpec
from plugins.contract.config_types import SharedPart
from plugins.contract.errors import ConfigError

log = logging.getLogger("switchyard.workers")

BACKLOG = 2048  # uvicorn's default
RESTART_PAUSE_S = 0.5  # doubles while a worker keeps dying within YOUNG_S of its start, up to 30 s
YOUNG_S = 60.0
_ROOT = Path(__file__).resolve().parents[1]


def worker_count(setting: int | Literal["auto"]) -> int:
    """`[server] workers`: a number, or "auto" for the cores this process may run on, capped by
    its cgroup's CPU quota rounded up (a container's CPU limit: a pod limited to 2 CPUs on a
    64-core node gets 2 workers, not 64)."""
    if setting == "auto":
        cores = len(os.sched_getaffinity(0)) or 1
        quota = cgroup_cpu_quota()
        return cores if quota is None else max(1, min(cores, math.ceil(quota)))
    return setting


def cgroup_cpu_quota() -> float | None:
    """The CPUs this process's cgroup may use (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`), None
    without a quota or a readable cgroup."""
    try:
        own = next((line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                    if line.startswith("0::")), "/").strip()
        for base in (Path("/sys/fs/cgroup") / own.lstrip("/"), Path("/sys/fs/cgroup")):
            if (base / "cpu.max").is_file():
                quota, period = (base / "cpu.max").read_text().split()
                return None if quota == "max" else int(quota) / int(period)
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        return None if quota <= 0 else quota / int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
    except (OSError, ValueError, IndexError):
        return None


def serve_workers(config: Config, *, host: str, port: int, drain_s: float, workers: int) -> int:
    """Serve `config` on `host:port` from `workers` processes until SIGTERM; the exit code."""
    logging.basicConfig(level=config.server.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_dir = Path(tempfile.mkdtemp(prefix="switchyard-workers-"))
    try:
        _use_multiprocess_metrics(run_dir / "metrics")
        try:
            sockets = listening_sockets(host, port, workers)
        except OSError as exc:
            log.error("cannot listen on %s:%s: %s", host, port, exc.strerror or exc)
            return 1
        return asyncio.run(WorkerPool(config, sockets, drain_s).run())
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def listening_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` listening sockets on one port (SO_REUSEPORT); port 0 picks one free port for all."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
            address = sock.getsockname()  # the port the first one got, for the others
            sock.listen(BACKLOG)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _use_multiprocess_metrics(directory: Path) -> None:
    """Every process of the server (this one, and the workers, which inherit the variable)
    writes its metrics into `directory`."""
    directory.mkdir()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    from prometheus_client import values

    from gateway.observability.multiprocess_values import mmap_value_class

    values.ValueClass = mmap_value_class()  # (prometheus_client was imported before the variable was set)


@dataclass
class Slot:
    """One worker's place: its socket, and the process serving it now."""

    index: int
    socket: socket.socket
    process: asyncio.subprocess.Process | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class WorkerPool:
    def __init__(self, config: Config, sockets: list[socket.socket], drain_s: float) -> None:
        from prometheus_client import Counter

        self.config = config
        self.drain_s = drain_s
        self.slots = [Slot(i, sock) for i, sock in enumerate(sockets)]
        self.draining = False
        self.restarts = Counter("switchyard_worker_restarts", "Worker processes restarted after they died, by worker number.",
                                ("worker",), registry=None)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.begin_drain)
        try:
            shared = await asyncio.to_thread(start_shared, self.config)
        except ConfigError as exc:
            print(f"switchyard: configuration error: {exc.message}", file=sys.stderr)
            return 2
        try:
            if self.draining:
                return 0
            self.config = shared.config
            host, port = self.slots[0].socket.getsockname()[:2]
            log.info("serving http://%s:%d with %d worker processes", host, port, len(self.slots))
            codes = await asyncio.gather(*(self._keep_running(slot) for slot in self.slots))
        finally:
            await asyncio.to_thread(shared.close)
            for slot in self.slots:
                slot.socket.close()
        failed = [code for code in codes if code]
        return failed[0] if failed else 0

    def begin_drain(self) -> None:
        if not self.draining:
            self.draining = True
            log.info("draining %d workers", len(self.slots))
            for slot in self.slots:
                slot.socket.close()  # the workers' copies close when they stop accepting
        for slot in self.slots:  # a second signal is passed on as well: the workers end requests at once
            if slot.process is not None and slot.process.returncode is None:
                slot.process.send_signal(signal.SIGTERM)

    async def _keep_running(self, slot: Slot) -> int:
        """Run the slot's worker, restarting it when it dies, until the pool drains; its last
        exit code (a worker that fails before it ever served stops the whole pool)."""
        pause = RESTART_PAUSE_S
        while True:
            started = time.monotonic()
            process = slot.process = await self._spawn(slot)
            if self.draining:  # the signal came while it started: it has not seen it
                process.send_signal(signal.SIGTERM)
            was_ready = await _wait_ready(process)
            if was_ready:
                slot.ready.set()
            code = await process.wait()
            if self.draining:  # a worker that got SIGTERM before it could drain died by it: no failure either
                return 0 if code in (0, -signal.SIGTERM) else code
            _forget_worker(process.pid)
            if not slot.ready.is_set():
                log.error("worker %d exited with code %s before it served; stopping", slot.index, code)
                self.begin_drain()
                return code or 1
            pause = pause * 2 if time.monotonic() - started < YOUNG_S else RESTART_PAUSE_S
            pause = min(pause, 30.0)
            log.error("worker %d (pid %d) exited with code %s; restarting it in %g s", slot.index, process.pid, code, pause)
            self.restarts.labels(str(slot.index)).inc()
            await asyncio.sleep(pause)
            if self.draining:
                return 0

    async def _spawn(self, slot: Slot) -> asyncio.subprocess.Process:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH")) if p)}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.worker",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
            pass_fds=(slot.socket.fileno(),), start_new_session=True,  # Ctrl-C reaches the parent, which passes it on
        )
        spec = WorkerSpec(index=slot.index, config=self.config, fd=slot.socket.fileno(), drain_s=self.drain_s)
        assert process.stdin is not None
        process.stdin.write(msgspec.json.encode(spec) + b"\n")  # the pipe stays open: the worker's lifeline
        await process.stdin.drain()
        return process


async def _wait_ready(process: asyncio.subprocess.Process) -> bool:
    """Whether the worker said it serves (one line on its stdout) before it exited."""
    assert process.stdout is not None
    return await process.stdout.readline() == b"ready\n"


def _forget_worker(pid: int) -> None:
    """Drop a dead worker's live gauges (its counters stay)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)


@dataclass
class Shared:
    config: Config  # with the options the shared parts gave the workers
    parts: list[SharedPart]

    def close(self) -> None:
        for part in reversed(self.parts):
            try:
                part.close()
            except Exception:  # noqa: BLE001 - close the others anyway
                log.exception("stopping a shared part failed")


def start_shared(config: Config) -> Shared:
    """Start each backend type's shared part once (blocking); a bad option is a `ConfigError`."""
    from gateway.config import resolve_backend_options
    from plugins.manager import backend_types, build_plugin_manager

    pm = build_plugin_manager(config.plugins.disable, config.plugins.modules)
    shared = Shared(config, [])
    backends = list(config.backends)
    try:
        for i, (cfg, btype, options) in enumerate(resolve_backend_options(config, backend_types(pm))):
            part = btype.share(cfg.name, options) if btype.share is not None else None
            if part is not None:
                shared.parts.append(part)
                backends[i] = msgspec.structs.replace(cfg, options=msgspec.to_builtins(part.options))
    except BaseException:
        shared.close()
        raise
    shared.config = msgspec.structs.replace(config, backends=backends)
    return shared
