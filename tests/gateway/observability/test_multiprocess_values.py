"""`gateway.observability.multiprocess_values.mmap_value_class`: the multiprocess values every worker writes. The files
say what prometheus-client's own multiprocess values would say, each process (a forked child
too) writes its own file, and a scrape adds them all up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from tests.support.server import ROOT

FORKING = """
import os, sys
os.environ["PROMETHEUS_MULTIPROC_DIR"] = sys.argv[1]
from prometheus_client import CollectorRegistry, Counter, values
from gateway.observability.multiprocess_values import mmap_value_class
values.ValueClass = mmap_value_class()
counter = Counter("sy_test", "t", registry=CollectorRegistry())
counter.inc(5)
child = os.fork()
if child == 0:
    counter.inc(2)  # the child's own file: its values start again from what its file holds (nothing)
    os._exit(0)
os.waitpid(child, 0)
counter.inc(1)
print(os.getpid(), child)
"""

# every kind of metric and gauge mode the gateway uses, with many keys (the file grows and is
# mapped again while values already in it keep being written)
WRITES = """
import os, sys
os.environ["PROMETHEUS_MULTIPROC_DIR"] = sys.argv[1]
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values
if sys.argv[2] == "ours":
    from gateway.observability.multiprocess_values import mmap_value_class
    values.ValueClass = mmap_value_class()
else:
    values.ValueClass = values.MultiProcessValue()
r = CollectorRegistry()
counter = Counter("sy_requests", "requests", ("route", "outcome"), registry=r)
hist = Histogram("sy_seconds", "seconds", ("route",), buckets=(0.01, 0.1, 1), registry=r)
live = Gauge("sy_in_flight", "in flight", ("route",), registry=r, multiprocess_mode="livesum")
worst = Gauge("sy_state", "state", ("backend",), registry=r, multiprocess_mode="livemax")
first = counter.labels("r0", "ok")
for i in range(400):
    counter.labels(f"r{i % 40}", "ok").inc(i % 3)
    first.inc(0.5)
    hist.labels(f"r{i % 7}").observe(i / 300)
    live.labels(f"r{i % 5}").inc()
    if i % 2:
        live.labels(f"r{i % 5}").dec()
    worst.labels(f"b{i % 3}").set(i % 4)
assert first._value.get() == 400 * 0.5 + sum(i % 3 for i in range(0, 400, 40))
"""


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    return out


def _scrape(directory: Path) -> str:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return generate_latest(registry).decode()


def test_each_process_and_forked_child_writes_its_own_file(tmp_path: Path) -> None:
    parent, child = _run(FORKING, str(tmp_path)).stdout.split()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"counter_{parent}.db", f"counter_{child}.db"])
    assert "\nsy_test_total 8.0\n" in _scrape(tmp_path)


def test_files_scrape_as_prometheus_clients_own_values_do(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    _run(WRITES, str(ours), "ours")
    _run(WRITES, str(theirs), "theirs")
    assert sorted(p.name.split("_")[0] for p in ours.iterdir()) == sorted(p.name.split("_")[0] for p in theirs.iterdir())
    scraped = _scrape(ours)
    assert sorted(scraped.splitlines()) == sorted(_scrape(theirs).splitlines())  # (files are read in any order)
    assert 'sy_requests_total{outcome="ok",route="r0"} 209.0' in scraped  # 200 from `first`, 9 from the loop
    assert 'sy_seconds_count{route="r0"} 58.0' in scraped
