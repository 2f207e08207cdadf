"""The top band's headroom through the real gateway in front of two real llama.cpp replicas,
each started with two slots (`-np 2`) for `replica_concurrency = 1` and `priority_headroom = 1`:
two holders' streams fill every ordinary slot, a flood queues behind them, and a top-band
request (its key's `priority = -1`: band 0) is served at once — granted into the headroom,
no `queued_ms`, while the holders still run and the flood still waits. Without the headroom the
same request queues: the test can tell the two apart. Every wait is on an event or a count (the
queue depth in /metrics, a response), never a sleep standing in for one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from engines.launch import ServerProcess
from tests.plugins.fleet.conftest import MODEL, replicas
from tests.support.probes import metric, wait_until, whole_request_log
from tests.support.queue_clients import Client, Holder, served_order
from tests.support.server import running_server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

KEYS = {"holder": 0, "flood": 0, "quiet": -1}  # key name -> its default priority: quiet is band 0


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    with replicas(2, tmp_path_factory.mktemp("replicas"), first=40) as servers:  # -np 2 each
        yield servers


def config(servers: list[ServerProcess], log: Path, headroom: int) -> str:
    keys = "".join(f'[[server.keys]]\nname = "{name}"\nkey = "sk-{name}"\npriority = {priority}\n' for name, priority in KEYS.items())
    endpoints = json.dumps([server.base_url for server in servers])
    return (f'[server]\nrequest_log = "{log}"\nhealth_interval_s = 0\n{keys}'
            '[server.flow_control]\nenabled = true\n\n[plugins]\ndisable = ["builtin"]\n\n'
            f'[[backends]]\nname = "fleet"\ntype = "llamacpp"\n'
            f'[backends.flow_control]\nreplica_concurrency = 1\npriority_headroom = {headroom}\n'
            f'[backends.options]\nendpoints = {endpoints}\nmodels = {{ "{MODEL}" = "{MODEL}" }}\nbalance = "least_load"\n')


def depth(base: str) -> float:
    return metric(httpx.get(base + "/metrics").text, "switchyard_flow_queue_depth")


def wait_depth(base: str, expected: int) -> None:
    assert wait_until(lambda: depth(base) == expected, timeout=30, interval=0.02), f"queue depth {depth(base)}, not {expected}"


def queued_grants(base: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics").text
    return {tenant: metric(text, "switchyard_flow_admissions_total", tenant=tenant, path="queued") for tenant in ("quiet", "flood")}


def test_a_top_band_request_is_served_at_once_while_the_flood_fills_every_slot(two_replicas: list[ServerProcess],
                                                                                 tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with running_server(config(two_replicas, log, headroom=1), tmp_path) as base, ExitStack() as holders:
        for _ in two_replicas:  # one stream per replica: every ordinary slot taken
            holders.enter_context(Holder(base))
        flood = [Client(base, "flood").send(f"a{i}") for i in range(3)]
        wait_depth(base, 3)
        quiet = Client(base, "quiet").send("b0").result(timeout=60)  # with the holders still running
        assert quiet.status == 200, quiet.body[:300]
        assert depth(base) == 3  # the flood still waits: it was not given the headroom
        text = httpx.get(base + "/metrics").text
        assert metric(text, "switchyard_flow_headroom_grants_total", backend="fleet", tenant="quiet", band="0") == 1
        assert metric(text, "switchyard_flow_headroom_grants_total", tenant="flood") == 0
        assert metric(text, "switchyard_flow_admissions_total", tenant="quiet", path="immediate") == 1
        holders.close()
        assert sorted(served_order(flood)) == ["a0", "a1", "a2"]
        lines = whole_request_log(log, 6)
    assert "queued_ms" not in lines["b0"] and lines["b0"]["outcome"] == "ok"  # it never waited in the gateway
    assert all(lines[f"a{i}"]["queued_ms"] >= 0 for i in range(3))


def test_without_headroom_the_top_band_waits_for_a_flood_request_to_end(two_replicas: list[ServerProcess],
                                                                        tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with running_server(config(two_replicas, log, headroom=0), tmp_path) as base, ExitStack() as holders:
        first, second = Holder(base), Holder(base)
        holders.enter_context(first)
        holders.enter_context(second)
        flood = [Client(base, "flood").send(f"a{i}") for i in range(3)]
        wait_depth(base, 3)
        quiet = Client(base, "quiet").send("b0")
        wait_depth(base, 4)  # it queues, first in line but behind every running request
        first.release()
        # the first slot freed goes to the top band's request, the last to come; the holders may
        # also end on their own (their slot's context runs out), so another grant may come with it
        assert wait_until(lambda: sum(queued_grants(base).values()) >= 1, timeout=30, interval=0.01)
        assert queued_grants(base)["quiet"] == 1, queued_grants(base)
        holders.close()
        assert sorted(served_order([*flood, quiet])) == ["a0", "a1", "a2", "b0"]
        lines = whole_request_log(log, 6)
    assert lines["b0"]["queued_ms"] >= 0
