"""The SQLite response store opened by several worker processes at once."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

from gateway.responses_api.store import SQLiteStore

WORKERS = 2
ROUNDS = 60


def _open_at_once(path: str, start: multiprocessing.synchronize.Barrier, results: multiprocessing.Queue) -> None:
    store = SQLiteStore(Path(path), ttl_s=None)
    start.wait()
    try:
        store._connect()
        store._close()
        results.put("ok")
    except sqlite3.Error as exc:
        results.put(repr(exc))


def test_workers_opening_a_fresh_store_together_all_succeed(tmp_path: Path) -> None:
    # Without the retry about one pair in ten loses the race for WAL mode with
    # "database is locked"; 60 fresh files make that near certain to show.
    context = multiprocessing.get_context("spawn")
    failures = []
    for round_ in range(ROUNDS):
        path = str(tmp_path / f"responses-{round_}.sqlite3")
        start, results = context.Barrier(WORKERS), context.Queue()
        workers = [context.Process(target=_open_at_once, args=(path, start, results)) for _ in range(WORKERS)]
        for worker in workers:
            worker.start()
        outcomes = [results.get(timeout=60) for _ in workers]
        for worker in workers:
            worker.join(timeout=60)
        failures += [outcome for outcome in outcomes if outcome != "ok"]
    assert failures == []
