"""Looking at a running gateway from a test: wait for a condition, read a metric, read its request log."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


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


def request_log(path: Path, count: int, timeout: float = 10.0) -> dict[str, dict[str, Any]]:
    """The request log's lines by request id, once `count` lines are written (a request's line
    comes after its answer has gone); when `timeout` passes first, the lines written by then."""
    wait_until(lambda: lines_written(path) >= count, timeout=timeout, interval=0.1)
    return {line["request_id"]: line for line in map(json.loads, path.read_bytes().splitlines())} if path.exists() else {}


def whole_request_log(path: Path, count: int, timeout: float = 10.0) -> dict[str, dict[str, Any]]:
    """`request_log`, failing the test unless `count` lines are written within `timeout`."""
    assert wait_until(lambda: lines_written(path) >= count, timeout=timeout), f"{lines_written(path)} lines in {path}, not {count}"
    return request_log(path, count, timeout=0)


def lines_written(path: Path) -> int:
    return len(path.read_bytes().splitlines()) if path.exists() else 0
