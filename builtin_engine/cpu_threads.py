"""Keep torch's CPU ops fast in the engine's step thread.

Torch runs CPU ops on OpenMP (libgomp), which keeps a pool of worker threads for every thread
that has run a parallel region, for that thread's whole life. Once the process holds more such
threads than it has cores, libgomp's workers stop spin-waiting between parallel regions and
sleep instead, so every small op of a decode step pays a futex wake-up: on 2 cores, a model
loaded in the caller's thread made the step thread's single-stream decode ~1.6x slower. Work
done before the step thread starts (loading, casting, allocating the KV cache) therefore runs in
a thread that ends with it, which takes its pool along.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


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
