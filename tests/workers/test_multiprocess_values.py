"""`gateway.metrics.multiprocess_value_class`: prometheus-client's multiprocess values with the
process id kept in a variable (no `getpid` per increment) still write each process's samples
to its own file, a forked child's included, and a scrape adds them all up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from tests.support.server import ROOT

PROCESS = """
import os, sys
os.environ["PROMETHEUS_MULTIPROC_DIR"] = sys.argv[1]
from prometheus_client import CollectorRegistry, Counter, values
from gateway.metrics import multiprocess_value_class
values.ValueClass = multiprocess_value_class()
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


def test_each_process_and_forked_child_writes_its_own_file(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", PROCESS, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    parent, child = out.stdout.split()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"counter_{parent}.db", f"counter_{child}.db"])
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    assert "\nsy_test_total 8.0\n" in generate_latest(registry).decode()
