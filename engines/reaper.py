"""Engine servers go down with the process that started them, even when it is killed.

`engines.launch` starts each server in a session of its own (so that vLLM's engine-core child
goes down with it), which also takes it out of reach of the signals that end its starter: a
gateway or a pytest run killed by SIGKILL or the OOM killer left its vLLM servers running
(~2.5 GB each). A parent-death signal does not fit: Linux sends it when the *thread* that
forked exits, and servers are started from worker threads too.

So the first server started spawns one reaper process, which holds the read end of a pipe
from its starter and the process groups to end. Each server's group is written to it when it
starts (`+PGID`) and when it is stopped (`-PGID`). When the pipe reaches end-of-file — the
starter exited, however it died — the reaper sends SIGTERM to the groups still listed and
SIGKILL to whatever is left `GRACE_S` later, then exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO

GRACE_S = 5.0

_lock = threading.Lock()
_pipe: IO[str] | None = None
_owner = 0  # the pid whose reaper `_pipe` feeds (a forked child starts its own)


def watch(pgid: int) -> None:
    """End process group `pgid` if this process exits before `unwatch(pgid)`."""
    global _pipe, _owner
    with _lock:
        if _pipe is None or _owner != os.getpid():
            reaper = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, text=True, start_new_session=True)
            _pipe, _owner = reaper.stdin, os.getpid()
        _send(f"+{pgid}")


def unwatch(pgid: int) -> None:
    with _lock:
        if _pipe is not None and _owner == os.getpid():
            _send(f"-{pgid}")


def _send(line: str) -> None:
    assert _pipe is not None
    try:
        _pipe.write(line + "\n")
        _pipe.flush()
    except (BrokenPipeError, ValueError):  # the reaper is gone: nothing else can end the groups
        pass


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _signal(pgids: set[int], sig: int) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the starter: its exit is what counts
    groups: set[int] = set()
    for line in sys.stdin:
        sign, pgid = line[:1], int(line[1:])
        if sign == "+":
            groups.add(pgid)
        else:
            groups.discard(pgid)
    groups = {pgid for pgid in groups if _alive(pgid)}
    _signal(groups, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while groups and time.monotonic() < deadline:
        time.sleep(0.1)
        groups = {pgid for pgid in groups if _alive(pgid)}
    _signal(groups, signal.SIGKILL)


if __name__ == "__main__":
    main()
