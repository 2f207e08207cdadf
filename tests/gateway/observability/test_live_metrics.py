"""`gateway.observability.live_collectors`: two processes' live replica families, copied into one multiprocess
directory, read back as the server's /metrics reads them (each process a worker of its own)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from tests.support.probes import metric
from tests.support.server import ROOT

WORKER = """
import os, sys
os.environ["PROMETHEUS_MULTIPROC_DIR"] = sys.argv[1]
from prometheus_client import CollectorRegistry
from plugins.fleet.replica import ReplicaStats
from gateway.observability.live_collectors import MultiprocessMirror
from gateway.observability.replica_load import WORKER_MODES, ReplicaCollector

in_flight, attempts = int(sys.argv[2]), int(sys.argv[3])

class Fleet:
    stats = ReplicaStats(backend="b", replica="http://r0", draining=False, in_flight=in_flight, circuit=int(sys.argv[4]),
                         healthy=True, attempts={"ok": attempts}, routed={}, load=1.0, stale=False, signal_age_s=0.5,
                         running=7.0, waiting=0.0, kv_cache_usage=0.25, prefix_queried_tokens=100,
                         prefix_hit_tokens=40, cached_blocks=3)

    def replica_stats(self):
        return [self.stats]

fleet = Fleet()
mirror = MultiprocessMirror(ReplicaCollector({"b": fleet}), CollectorRegistry(), WORKER_MODES)
mirror.refresh()
fleet.stats.attempts["ok"] += 1  # counted once more, not twice
mirror.refresh()
mirror.refresh()
"""


def test_two_workers_replica_families_combine(tmp_path: Path) -> None:
    for in_flight, attempts, circuit in ((2, 5, 0), (3, 4, 2)):
        subprocess.run([sys.executable, "-c", WORKER, str(tmp_path), str(in_flight), str(attempts), str(circuit)],
                       cwd=ROOT, check=True)
    shown = CollectorRegistry()
    MultiProcessCollector(shown, path=str(tmp_path))
    text = generate_latest(shown).decode()
    labels = {"backend": "b", "replica": "http://r0"}
    assert metric(text, "switchyard_replica_requests_in_flight", **labels) == 5  # summed
    assert metric(text, "switchyard_replica_attempts_total", outcome="ok", **labels) == 6 + 5  # summed, each once
    assert metric(text, "switchyard_replica_circuit_state", **labels) == 2  # the worst
    assert metric(text, "switchyard_replica_engine_requests", state="running", **labels) == 7  # the engine's, once
    assert metric(text, "switchyard_replica_engine_prefix_cache_tokens_total", kind="hit", **labels) == 40
    assert metric(text, "switchyard_replica_engine_kv_cache_usage", **labels) == 0.25
