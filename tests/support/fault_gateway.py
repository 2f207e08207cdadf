"""The fault matrix's fixtures: one faulty upstream process, one gateway (in a thread of the
test process, so its tasks and pools can be inspected) whose `vllm` and `llamacpp` backends
point at that upstream, and two more backends of the same types pointing at a closed port.
A test module gets them by importing them (tests/e2e/faults/conftest.py does, for its whole
folder); `after_each_row`, imported with them, checks every test of the module."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support import faulty_upstream
from tests.support.faulty_upstream import FaultyUpstream
from tests.support.gateway_thread import GatewayThread
from tests.support.probes import wait_until
from tests.support.server import free_port

ENGINES = ("vllm", "llamacpp")
FIRST_BYTE_S = 1.0
IDLE_S = 0.6


def backend(name: str, engine: str, url: str, model: str) -> str:
    return f"""
[[backends]]
name = "{name}"
type = "{engine}"
[backends.options]
base_url = "{url}"
models = {{ "{model}" = "up" }}
[backends.options.timeouts]
connect_s = 1.0
first_byte_s = {FIRST_BYTE_S}
idle_s = {IDLE_S}
"""


def fault_config(upstream_url: str, dead_url: str) -> str:
    text = """
[server]
health_interval_s = 0
breaker_failures = 1000

[plugins]
disable = ["builtin"]
"""
    for engine in ENGINES:
        text += backend(engine, engine, upstream_url, f"m-{engine}")
        text += backend(f"dead-{engine}", engine, dead_url, f"m-dead-{engine}")
    for engine in ENGINES:
        text += f"""
[[routes]]
name = "fallback-{engine}"
strategy = "fallback"
[[routes.targets]]
backend = "dead-{engine}"
model = "m-dead-{engine}"
[[routes.targets]]
backend = "{engine}"
model = "m-{engine}"
"""
    return text


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultyUpstream]:
    log = tmp_path_factory.mktemp("faulty-upstream") / "upstream.log"
    up = faulty_upstream.start(str(log))
    try:
        yield up
    finally:
        faulty_upstream.stop(up)


@pytest.fixture(scope="module")
def gw(upstream: FaultyUpstream) -> Iterator[GatewayThread]:
    with GatewayThread(fault_config(upstream.url, f"http://127.0.0.1:{free_port()}")) as g:
        with httpx.Client(base_url=g.base, timeout=10) as http:
            for engine in ENGINES:  # warm: catalogue known, one pooled connection each
                assert http.post("/v1/chat/completions", json=chat(f"m-{engine}", "warm up")).status_code == 200
        g.baseline_tasks = g.task_names()  # type: ignore[attr-defined]
        yield g


@pytest.fixture(scope="module")
def plain_gw(upstream: FaultyUpstream) -> Iterator[GatewayThread]:
    """The same gateway as `gw` on uvicorn's own protocol, the bare Litestar app: how it answers
    without our server's direct writes."""
    with GatewayThread(fault_config(upstream.url, f"http://127.0.0.1:{free_port()}"), plain=True) as g:
        yield g


@pytest.fixture
def http(gw: GatewayThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gw.base, timeout=15) as c:
        yield c


def chat(model: str, text: str, **extra: object) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 50, **extra}


@pytest.fixture(autouse=True)
def after_each_row(gw: GatewayThread, upstream: FaultyUpstream) -> Iterator[None]:
    """After each row: no task left behind, no upstream connection beyond the idle ones in the
    pools, and the gateway still serves both engines."""
    yield
    baseline = gw.baseline_tasks  # type: ignore[attr-defined]
    assert wait_until(lambda: gw.task_names() == baseline, timeout=5), f"leaked tasks: {gw.task_names()} vs {baseline}"

    def pools_settled() -> bool:
        pools = gw.pools()
        busy = sum(b for _, b in pools.values())
        idle = sum(g.pools()[e][0] for g in GatewayThread.running for e in ENGINES)  # other gateways' too
        return busy == 0 and upstream.stats()["open_connections"] <= idle

    assert wait_until(pools_settled, timeout=5), f"pools {gw.pools()}, upstream open {upstream.stats()['open_connections']}"
    with httpx.Client(base_url=gw.base, timeout=10) as http:
        for engine in ENGINES:
            resp = http.post("/v1/chat/completions", json=chat(f"m-{engine}", "still serving"))
            assert resp.status_code == 200, resp.text
            assert resp.json()["choices"][0]["message"]["content"] == " still serving"
