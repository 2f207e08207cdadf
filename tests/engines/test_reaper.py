"""Engine servers started by `engines.launch` end when their starter dies without stopping them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from engines import reaper
from tests.support.probes import wait_until

ROOT = Path(__file__).resolve().parents[2]

# a starter that launches one "server" (a sleeping Python, optionally deaf to SIGTERM) the way
# the engine launchers do, prints its pid, stops it if asked, then waits to be killed
_STARTER = textwrap.dedent("""
    import sys, tempfile, time
    from engines import launch
    deaf, stop = sys.argv[1] == "deaf", sys.argv[2] == "stop"
    code = ("import signal, time; " + ("signal.signal(signal.SIGTERM, signal.SIG_IGN); " if deaf else "")
            + "print('up', flush=True); time.sleep(600)")
    server = launch._spawn("sleeper", [sys.executable, "-c", code], host="127.0.0.1", port=1,
                           env=None, log_dir=tempfile.mkdtemp())
    while b"up" not in server.log_path.read_bytes():
        time.sleep(0.02)
    if stop:
        server.stop()
    print(server.pid, flush=True)
    time.sleep(600)
""")


def _start(deaf: bool = False, stop: bool = False) -> tuple[subprocess.Popen[str], int]:
    starter = subprocess.Popen([sys.executable, "-c", _STARTER, "deaf" if deaf else "-", "stop" if stop else "-"],
                               cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert starter.stdout is not None
    return starter, int(starter.stdout.readline())


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _reaper_of(starter: subprocess.Popen[str]) -> psutil.Process:
    (child,) = [p for p in psutil.Process(starter.pid).children() if "reaper.py" in " ".join(p.cmdline())]
    return child


@pytest.mark.parametrize("deaf", [False, True], ids=["stops-on-sigterm", "ignores-sigterm"])
def test_a_killed_starter_takes_its_servers_down(deaf: bool) -> None:
    starter, server = _start(deaf=deaf)
    try:
        reaper_process = _reaper_of(starter)
        assert not _gone(server)
        starter.kill()  # SIGKILL: no finalizer runs
        starter.wait()
        assert wait_until(lambda: _gone(server), timeout=reaper.GRACE_S + 10)
        assert wait_until(lambda: _gone(reaper_process.pid), timeout=10)
    finally:
        starter.kill()
        if not _gone(server):
            os.kill(server, signal.SIGKILL)


def test_a_group_unwatched_is_left_alone() -> None:
    """What `ServerProcess.stop` tells the reaper (`-PGID`) takes the group off its list: a pgid
    freed by a stopped server and reused by another session must not be signalled."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        lines = f"+{other.pid}\n+999999999\n-{other.pid}\n"
        done = subprocess.run([sys.executable, "-I", reaper.__file__], input=lines, text=True, timeout=30)
        assert done.returncode == 0
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
