"""Keep torch's CPU ops fast in the engine's step thread.

Torch runs CPU ops on OpenMP (libgomp), which keeps a pool of worker threads for every thread
that has run a parallel region, for that thread's whole life. Once the process holds more such
threads than it has cores, libgomp's workers stop spin-waiting between parallel regions and
sleep instead, so every small op of a decode step pays a futex wake-up: on 2 cores, a model
loaded in the caller's thread made the step thread's single-stream decode ~1.6x slower. Work
done before the step thread starts (loading, casting, allocating the KV cache) therefore runs in
a thread that ends with it, which takes its pool along.

libgomp's workers also spin for a long while (GOMP_SPINCOUNT, 300,000 turns: milliseconds)
waiting for the next parallel region, and a region's master spins at its barrier for a worker
that another process (or the gateway's event loop) has taken the core from. On a shared 2-core
machine that made every path 5-15x slower behind one busy process. `default_openmp_env` caps the
spin before torch loads libgomp (it reads its environment once, when loaded): short enough that
a waiting thread yields its core, long enough to bridge the gap between two ops of a step.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# libgomp's spin before a waiting thread sleeps (its default: 300,000); unset when the user sets
# GOMP_SPINCOUNT or OMP_WAIT_POLICY
OPENMP_SPIN_COUNT = "1000"


def default_openmp_env() -> bool:
    """Cap libgomp's spin-wait (see the module's docstring) unless the environment says how to
    wait; False when torch was imported before this ran, so the setting came too late."""
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = OPENMP_SPIN_COUNT
    return "torch" not in sys.modules


def call_in_own_thread(fn: Callable[[], T], *, name: str) -> T:
    """fn() in a new thread, joined; its result, or its exception raised here."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(fn())
        except BaseException as exc:  # handed to the caller
            failure.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]
