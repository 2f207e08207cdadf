"""Fleets of real llama.cpp replicas behind one backend: prefix hits where the prefix was sent,
a killed replica skipped and its breaker open, replicas added and drained (file and DNS
discovery) while streams run, distinct tenants spread over idle replicas."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from engines.launch import ServerProcess
from plugins.contract.protocol import Finish, RequestSpec, Usage
from plugins.proxy.llamacpp import LlamaCppBackend, LlamaCppOptions
from plugins.transport.health import BreakerState
from tests.plugins.fleet.conftest import MODEL, DnsZone, chat, dns_zone, replicas, tenant_prompt, three_replicas  # noqa: F401 - fixtures
from tests.support.probes import metric, wait_until_async
from tests.support.server import running_server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def fleet_backend(**options: Any) -> LlamaCppBackend:
    return LlamaCppBackend("fleet", msgspec.convert({"models": {MODEL: MODEL}, **options}, LlamaCppOptions))


async def run(backend: LlamaCppBackend, spec: RequestSpec) -> tuple[list[Any], Usage, str | None]:
    """The request's events, its usage and the replica that served it."""
    stream = backend.generate(spec)
    events = [e async for e in stream]
    assert isinstance(events[-1], Usage), events[-2:]
    return events, events[-1], stream.served_by  # type: ignore[attr-defined]


async def wait_for(check: Any, timeout: float = 20.0) -> bool:
    return await wait_until_async(check, timeout)


def urls(servers: list[ServerProcess]) -> list[str]:
    return [s.base_url for s in servers]


def test_a_repeated_system_prompt_hits_the_replica_that_served_it(three_replicas: list[ServerProcess],
                                                                   tmp_path: Path) -> None:
    """Through the gateway and the `openai` client: the second request's usage shows the cache."""
    from openai import OpenAI

    log = tmp_path / "requests.jsonl"
    config = (f'[server]\nrequest_log = "{log}"\n\n[plugins]\ndisable = ["builtin"]\n\n'
              f'[[backends]]\nname = "fleet"\ntype = "llamacpp"\n[backends.options]\n'
              f'endpoints = {json.dumps(urls(three_replicas[:2]))}\nmodels = {{ "{MODEL}" = "{MODEL}" }}\n')
    with running_server(config, tmp_path) as base:
        client = OpenAI(base_url=base + "/v1", api_key="unused")
        system = {"role": "system", "content": tenant_prompt(11, 1500)}
        usages = []
        for question in ("Which siding?", "Which wagon?"):
            reply = client.chat.completions.create(model=MODEL, messages=[system, {"role": "user", "content": question}],
                                                   max_tokens=4, temperature=0)
            usages.append(reply.usage)
        assert usages[1].prompt_tokens_details.cached_tokens > 0.8 * usages[1].prompt_tokens, usages
        metrics_text = httpx.get(base + "/metrics").text
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(log.read_text().splitlines()) < 2:
            time.sleep(0.05)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 2 and lines[0]["replica"] == lines[1]["replica"] in urls(three_replicas[:2])
    served = lines[0]["replica"]
    assert metric(metrics_text, "switchyard_replica_attempts_total", backend="fleet", replica=served, outcome="ok") == 2
    assert metric(metrics_text, "switchyard_replica_routed_total", replica=served, reason="prefix_hit") == 1


def test_five_tenants_use_all_three_idle_replicas_and_stay_there(three_replicas: list[ServerProcess]) -> None:
    async def go() -> None:
        backend = fleet_backend(endpoints=urls(three_replicas))
        await backend.start()
        try:
            home: dict[int, str] = {}
            for tenant in range(5):
                spec = chat("Which siding?", system=tenant_prompt(tenant, 1000))
                _, _, home[tenant] = await run(backend, spec)
            assert set(home.values()) == set(urls(three_replicas))
            for tenant in range(5):
                spec = chat("And which wagon?", system=tenant_prompt(tenant, 1000))
                _, usage, served_by = await run(backend, spec)
                assert served_by == home[tenant]
                assert usage.cached_tokens and usage.cached_tokens > 0.8 * usage.prompt_tokens, usage
        finally:
            await backend.close()

    asyncio.run(go())


def test_a_killed_replica_is_skipped_and_its_breaker_opens(tmp_path: Path) -> None:
    with replicas(3, tmp_path, first=5) as servers:
        async def go() -> None:
            backend = fleet_backend(endpoints=urls(servers), replica_breaker={"failures": 2, "cooldown_s": 60})
            await backend.start()
            try:
                await run(backend, chat("warm up"))
                dead = servers[1]
                ok_before = {s.replica: s for s in backend.fleet.stats()}[dead.base_url].attempts.get("ok", 0)
                dead.proc.kill()
                dead.proc.wait()
                breaker = backend.fleet.monitor.breakers[dead.base_url]
                for i in range(8):  # every request succeeds: the dead replica's failures happen before the first byte
                    _, usage, _ = await run(backend, chat(f"question {i} about siding {i}"))
                    assert usage.completion_tokens > 0
                assert await wait_for(lambda: breaker.state is BreakerState.OPEN)
                stats = {s.replica: s for s in backend.fleet.stats()}
                tried_dead = stats[dead.base_url].attempts
                assert tried_dead.get("bad_gateway", 0) >= 2 and tried_dead.get("ok", 0) == ok_before
                for i in range(4):
                    _, _, served_by = await run(backend, chat(f"after the breaker opened {i}"))
                    assert served_by != dead.base_url
                assert {s.replica: s for s in backend.fleet.stats()}[dead.base_url].attempts == tried_dead
            finally:
                await backend.close()

        asyncio.run(go())


async def _stream_until_first_token(backend: LlamaCppBackend, spec: RequestSpec, first: asyncio.Event,
                                    served_by: list[str | None]) -> list[Any]:
    """The request's events; `served_by` gets the replica it went to as soon as its first event came."""
    events = []
    stream = backend.generate(spec)
    async for event in stream:
        events.append(event)
        if not first.is_set():
            served_by.append(stream.served_by)  # type: ignore[attr-defined]
        first.set()
    return events


def long_stream(i: int) -> RequestSpec:
    return chat(f"Tell the long story of wagon {i}.", max_tokens=96, request_id=f"s{i}", sampling={"ignore_eos": True})


async def drain_while_streaming(backend: LlamaCppBackend, keep: str, leave: str, change: Any, joined: str | None) -> None:
    """Four streams round-robin over two replicas; `change()` drops `leave` from discovery while
    they run. Every stream still ends normally; `leave` closes after its last stream; new
    requests avoid it."""
    await backend.start()
    try:
        assert await wait_for(lambda: set(backend.fleet.replicas) == {keep, leave})
        firsts = [asyncio.Event() for _ in range(4)]
        specs = [long_stream(i) for i in range(4)]
        served_by: list[str | None] = []
        tasks = [asyncio.create_task(_stream_until_first_token(backend, s, e, served_by)) for s, e in zip(specs, firsts)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in firsts)), 60)
        assert set(served_by) == {keep, leave}
        change()
        assert await wait_for(lambda: backend.fleet.replicas.get(leave) is None or backend.fleet.replicas[leave].draining)
        if joined is not None:
            assert await wait_for(lambda: joined in backend.fleet.replicas)
        results = await asyncio.gather(*tasks)
        for events in results:  # no stream was cut: each ran to its length and its usage
            assert isinstance(events[-2], Finish) and events[-2].reason == "length", events[-3:]
            assert isinstance(events[-1], Usage) and events[-1].completion_tokens >= 96
        assert await wait_for(lambda: leave not in backend.fleet.replicas)  # drained, then closed
        for i in range(4):
            _, _, served_by_after = await run(backend, chat(f"after the drain {i}"))
            assert served_by_after != leave
    finally:
        await backend.close()


def test_file_discovery_adds_and_drains_replicas_while_streams_run(tmp_path: Path) -> None:
    with replicas(3, tmp_path, first=8) as servers:
        a, b, c = urls(servers)
        listing = tmp_path / "replicas.json"
        listing.write_text(json.dumps([a, b]))

        def change() -> None:
            listing.write_text(json.dumps({"endpoints": [a, c]}))

        backend = fleet_backend(discovery={"type": "file", "path": str(listing), "interval_s": 0.1}, balance="round_robin")
        asyncio.run(drain_while_streaming(backend, a, b, change, joined=c))


def test_dns_discovery_drains_a_replica_whose_record_goes(three_replicas: list[ServerProcess], dns_zone: DnsZone) -> None:
    a, b = three_replicas[0], three_replicas[1]
    port = int(a.base_url.rsplit(":", 1)[1])
    host = lambda s: s.base_url.split("//")[1].rsplit(":", 1)[0]  # noqa: E731
    dns_zone.set("llama.fleet.test", [host(a), host(b)])
    backend = fleet_backend(discovery={"type": "dns", "name": "llama.fleet.test", "port": port,
                                       "resolver": dns_zone.resolver, "interval_s": 0.2}, balance="round_robin")
    asyncio.run(drain_while_streaming(backend, a.base_url, b.base_url,
                                      lambda: dns_zone.set("llama.fleet.test", [host(a)]), joined=None))


@pytest.fixture
def echo_upstreams() -> Iterator[list[str]]:
    from tests.support import faulty_upstream

    started = [faulty_upstream.start() for _ in range(4)]
    try:
        yield [u.url for u in started]
    finally:
        for upstream in started:
            faulty_upstream.stop(upstream)


def test_a_b_between_fleets_stays_exact(echo_upstreams: list[str], tmp_path: Path) -> None:
    """A sticky 70/30 route whose two targets are fleets: every user lands on the target the
    route's hash gives it, whichever replica serves inside."""
    from plugins.contract.config_types import Target
    from plugins.routing.sticky import pick_rendezvous

    fleets = {"blue": echo_upstreams[:2], "green": echo_upstreams[2:]}
    config = '[plugins]\ndisable = ["builtin"]\n\n'
    for name, members in fleets.items():
        config += (f'[[backends]]\nname = "{name}"\ntype = "vllm"\n[backends.options]\n'
                   f'endpoints = {json.dumps(members)}\nmodels = {{ "m" = "up" }}\nbalance = "least_load"\n\n')
    config += ('[[routes]]\nname = "chat"\nstrategy = "sticky"\n'
               '[[routes.targets]]\nbackend = "blue"\nmodel = "m"\nweight = 70\n'
               '[[routes.targets]]\nbackend = "green"\nmodel = "m"\nweight = 30\n')
    targets = [Target(backend="blue", model="m", weight=70), Target(backend="green", model="m", weight=30)]
    with running_server(config, tmp_path) as base, httpx.Client(base_url=base, timeout=30) as http:
        served = {}
        for i in range(120):
            user = f"user-{i}"
            r = http.post("/v1/chat/completions", json={"model": "chat", "user": user, "max_tokens": 5,
                                                        "messages": [{"role": "user", "content": f"hello {i}"}]})
            assert r.status_code == 200, r.text
            served[user] = r.headers["x-switchyard-backend"]
        text = http.get("/metrics").text
    expected = {u: pick_rendezvous(f"user={u}", "chat", targets).backend for u in served}
    assert served == expected
    assert 0.55 < sum(b == "blue" for b in served.values()) / len(served) < 0.85
    for name, members in fleets.items():  # and inside each target, both replicas served
        for url in members:
            assert metric(text, "switchyard_replica_attempts_total", backend=name, replica=url, outcome="ok") > 0
