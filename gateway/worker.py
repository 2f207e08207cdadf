"""One worker process of a server with `[server] workers` > 1: `python -m gateway.worker`.

It reads its `WorkerSpec` (one JSON line) on stdin, serves the configuration on the listening
socket its parent handed it (`gateway.server`, with its own event loop, plugin manager and
backends) and writes `ready` on stdout once it accepts requests. Its stdin stays open as a
lifeline: when the parent goes away the worker drains and exits as on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading

import msgspec

from gateway.config import Config


class WorkerSpec(msgspec.Struct, frozen=True, kw_only=True):
    index: int  # 0..N-1, the `x-switchyard-worker` response header
    config: Config  # with the options of the parts the parent started for all workers
    fd: int  # the listening socket's file descriptor
    drain_s: float


def main() -> int:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # (set by the parent)
        from prometheus_client import values

        from gateway.observability.multiprocess_values import mmap_value_class

        values.ValueClass = mmap_value_class()
    from gateway.server import serve

    spec = msgspec.json.decode(sys.stdin.buffer.readline(), type=WorkerSpec)
    sock = socket.socket(fileno=spec.fd)
    host, port = sock.getsockname()[:2]
    _drain_when_parent_goes()
    serve(spec.config, host=host, port=port, drain_s=spec.drain_s, sockets=[sock], worker=spec.index,
          on_ready=_report_ready)
    return 0


def _report_ready() -> None:
    """Tell the parent; from then on stdout goes where stderr goes, so no later print can fill
    a pipe nobody reads."""
    sys.stdout.buffer.write(b"ready\n")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())


def _drain_when_parent_goes() -> None:
    def wait() -> None:
        while os.read(sys.stdin.fileno(), 4096):  # the raw fd: a buffered read here would block interpreter exit
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait, name="worker-lifeline", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
