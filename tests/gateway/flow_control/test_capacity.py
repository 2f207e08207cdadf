"""A backend's capacity and room, read off real `Replica` objects and engine load snapshots, a
real proxy backend's fleet and the built-in backend."""

from __future__ import annotations

import time

import msgspec

from gateway.flow_control.capacity import UNBOUNDED, backend_readings, fleet_capacity, fleet_has_room, share_of
from plugins.builtin.backend import BuiltinBackend
from plugins.builtin.options import BuiltinOptions
from plugins.fleet.load_signals import LoadSnapshot
from plugins.fleet.replica import Replica
from plugins.proxy.llamacpp import LlamaCppBackend, LlamaCppOptions
from plugins.transport.http1 import Pool


def replica(port: int, *, in_flight: int = 0, running: float | None = None, waiting: float = 0.0) -> Replica:
    made = Replica(url=f"http://127.0.0.1:{port}", pool=Pool(f"http://127.0.0.1:{port}"), stale_after_s=3.0)
    made.in_flight = in_flight
    if running is not None:
        made.observe(LoadSnapshot(running=running, waiting=waiting, at=time.monotonic()))
    return made


def test_capacity_is_the_routable_replicas_slots() -> None:
    replicas = [replica(9), replica(10), replica(11)]
    assert fleet_capacity(replicas, 4) == 12
    assert fleet_capacity(replicas[:1], 4) == 4
    assert fleet_capacity(replicas, None) == UNBOUNDED


def test_room_while_some_replica_is_below_its_concurrency() -> None:
    assert fleet_has_room([replica(9, in_flight=4), replica(10, in_flight=3)], 4)
    assert not fleet_has_room([replica(9, in_flight=4), replica(10, in_flight=5)], 4)
    assert not fleet_has_room([], 4)


def test_an_engine_that_reports_a_queue_is_full_whatever_our_count() -> None:
    queuing = replica(9, in_flight=0, running=2, waiting=1)  # other clients fill it
    assert not fleet_has_room([queuing], 4)
    assert not fleet_has_room([queuing], None)
    assert fleet_has_room([queuing, replica(10, running=1)], None)


def test_the_engine_reported_load_counts_other_clients() -> None:
    assert not fleet_has_room([replica(9, in_flight=1, running=4)], 4)  # 3 of the 4 are not ours
    assert fleet_has_room([replica(9, in_flight=1, running=3)], 4)


def test_a_proxy_backend_reads_its_routable_replicas() -> None:
    backend = LlamaCppBackend("fleet", msgspec.convert({"endpoints": ["http://127.0.0.1:9", "http://127.0.0.1:10"]},
                                                       LlamaCppOptions))
    capacity, has_room = backend_readings(backend, max_concurrent=None, replica_concurrency=2)
    assert (capacity(), has_room()) == (4, True)
    for replica in backend.fleet.replicas.values():
        replica.in_flight = 2
    assert not has_room()
    backend.fleet.replicas["http://127.0.0.1:9"].draining = True  # leaving: no longer counted
    assert capacity() == 2
    assert backend_readings(backend, max_concurrent=3, replica_concurrency=2)[0]() == 3  # the whole backend's bound
    assert backend_readings(backend, max_concurrent=None, replica_concurrency=2, workers=2)[0]() == 1  # one worker's share


def test_the_builtin_engine_is_one_replica_of_its_batch_size() -> None:
    backend = BuiltinBackend("local", msgspec.convert({"max_num_seqs": 6}, BuiltinOptions))
    capacity, has_room = backend_readings(backend, max_concurrent=None, replica_concurrency=None)
    assert capacity() == 6
    assert not has_room()  # not started: no engine takes requests yet
    assert backend_readings(backend, max_concurrent=2, replica_concurrency=None)[0]() == 2


def test_a_worker_share_of_the_slots() -> None:
    assert [share_of(8, 1), share_of(8, 3), share_of(1, 4), share_of(UNBOUNDED, 4)] == [8, 2, 1, UNBOUNDED]
