"""`EngineSupervisor`: starts one backend's engine process, restarts it when it dies, stops it.

The engine process (`python -m builtin_engine.process.server`) gets its launch on stdin and keeps
that pipe as its lifeline: closing it (here, or by this process dying) makes it shut down, so
no engine outlives the gateway that started it. It runs in a session of its own, so a Ctrl-C in
the terminal reaches the gateway (which drains first) and not the engine under it.

A thread waits on the process; when it exits unexpectedly the supervisor logs it and starts a
new one after a pause that doubles from `RESTART_PAUSE_S`, at most `MAX_RESTARTS` times within
`RESTART_WINDOW_S` (then it gives up, logged; the backend stays unavailable and `/ready` says
so). Clients reconnect to the same address by themselves.

Blocking calls only (`start`, `close`): callers run them in a thread.
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgspec

from builtin_engine.process.calls import EngineLaunch, LaunchFailed, LaunchReport, ProcessLaunch

log = logging.getLogger("switchyard.engine_supervisor")

MAX_RESTARTS = 5
RESTART_WINDOW_S = 600.0
RESTART_PAUSE_S = 0.5
STOP_TIMEOUT_S = 15.0
_ROOT = Path(__file__).resolve().parents[2]  # where `builtin_engine` is importable from


class EngineLaunchError(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class EngineSupervisor:
    def __init__(self, backend: str, launch: EngineLaunch, *, start_timeout_s: float = 600.0) -> None:
        self.backend = backend
        self.launch = launch
        self.start_timeout_s = start_timeout_s
        self._dir = tempfile.mkdtemp(prefix="switchyard-engine-")
        self.address = f"ipc://{self._dir}/engine.sock"
        self.restarts = 0  # restarts after a crash
        self.gave_up = False
        self._process: subprocess.Popen[bytes] | None = None
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Start the engine process and wait until it serves. Raises `EngineLaunchError` when the
        engine cannot be built (the message says why; `param` names the option at fault)."""
        self._process = self._spawn()
        self._watcher = threading.Thread(target=self._watch, name=f"engine-supervisor-{self.backend}", daemon=True)
        self._watcher.start()

    def close(self) -> None:
        """Ask the engine process to stop (it ends what is in flight with an error), wait for it,
        kill it if it does not stop within `STOP_TIMEOUT_S`."""
        self._closing.set()
        process = self._process
        if process is not None:
            _stop(process)
        if self._watcher is not None:
            self._watcher.join(STOP_TIMEOUT_S)
        shutil.rmtree(self._dir, ignore_errors=True)

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH")) if p)}
        process = subprocess.Popen(
            [sys.executable, "-m", "builtin_engine.process.server"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True,
        )
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(msgspec.json.encode(ProcessLaunch(engine=self.launch, address=self.address)) + b"\n")
        process.stdin.flush()
        try:
            report = self._read_report(process)
        except BaseException:
            _stop(process)
            raise
        finally:
            process.stdout.close()
        if isinstance(report, LaunchFailed):
            process.wait()
            raise EngineLaunchError(report.message, report.param)
        log.info("backend %r: engine process %d serves at %s", self.backend, report.pid, self.address)
        return process

    def _read_report(self, process: subprocess.Popen[bytes]) -> LaunchReport:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], self.start_timeout_s)
        if not ready:
            raise EngineLaunchError(f"the engine process did not start within {self.start_timeout_s:g} s")
        line = process.stdout.readline()
        if not line:
            raise EngineLaunchError(f"the engine process exited with code {process.wait()} before it served (see its log)")
        return msgspec.json.decode(line, type=LaunchReport)

    def _watch(self) -> None:
        crashes: list[float] = []
        while True:
            assert self._process is not None
            code = self._process.wait()
            if self._closing.is_set():
                return
            now = time.monotonic()
            crashes = [t for t in crashes if now - t < RESTART_WINDOW_S] + [now]
            if len(crashes) > MAX_RESTARTS:
                self.gave_up = True
                log.error("backend %r: the engine process exited with code %s, the %d. time in %g s; not restarting it "
                          "again", self.backend, code, len(crashes), RESTART_WINDOW_S)
                return
            pause = min(RESTART_PAUSE_S * 2 ** (len(crashes) - 1), 30.0)
            log.error("backend %r: the engine process exited with code %s; restarting it in %g s (restart %d of at "
                      "most %d per %g s)", self.backend, code, pause, len(crashes), MAX_RESTARTS, RESTART_WINDOW_S)
            if self._closing.wait(pause):
                return
            try:
                self._process = self._spawn()
            except (EngineLaunchError, OSError) as exc:
                log.error("backend %r: restarting the engine process failed: %s", self.backend, exc)
                continue  # the failed process has exited: wait() returns at once and counts it
            self.restarts += 1


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.stdin is not None and not process.stdin.closed:
        try:
            process.stdin.close()  # the lifeline: the engine shuts down
        except OSError:
            pass
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        log.warning("the engine process %d did not stop within %g s; killing it", process.pid, STOP_TIMEOUT_S)
        process.kill()
        process.wait()
