"""A fleet's capacity and room, read off real `Replica` objects and engine load snapshots."""

from __future__ import annotations

import time

from gateway.flow_control.capacity import UNBOUNDED, fleet_capacity, fleet_has_room
from plugins.fleet.load_signals import LoadSnapshot
from plugins.fleet.replica import Replica
from plugins.http1 import Pool


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
