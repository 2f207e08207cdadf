"""Looking at a running gateway from a test: wait for a condition, read a metric."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def wait_until(check: Callable[[], bool], timeout: float = 5.0, interval: float = 0.05) -> bool:
    """Poll `check` until it holds or `timeout` seconds pass; whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval)
    return check()


async def wait_until_async(check: Callable[[], bool], timeout: float = 5.0, interval: float = 0.05) -> bool:
    """`wait_until` for a test running its own event loop: the loop keeps running meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        await asyncio.sleep(interval)
    return check()


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of every sample of `name` in a /metrics body whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(pair.split("=", 1) for pair in line[len(name) + 1 : line.index("}")].replace('"', "").split(","))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
