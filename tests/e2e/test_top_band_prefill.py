"""`isolate_top_band_prefill` through the real gateway process in front of two upstream
processes (the recording faulty upstream, whose `pace:` holds each answer's first event back
the way an engine's prefill does): while a top-band request (its key's `priority = -1`) waits
for its first byte on one replica, every new request of the band below goes to the other one;
without the knob `least_busy` sends one of them beside it. Where each request landed is read
from the upstreams themselves, and every wait is on an arrival, never a sleep."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import faulty_upstream
from tests.support.faulty_upstream import FaultyUpstream
from tests.support.probes import wait_until
from tests.support.server import running_server

PREFILL_MS = 2000  # the top-band request's first event comes this long after its head (and each later one)
FLOODS = 3


@pytest.fixture(scope="module")
def upstreams() -> Iterator[list[FaultyUpstream]]:
    ups = [faulty_upstream.start() for _ in range(2)]
    try:
        yield ups
    finally:
        for up in ups:
            faulty_upstream.stop(up)


def config(ups: list[FaultyUpstream], isolate: bool) -> str:
    keys = "".join(f'[[server.keys]]\nname = "{name}"\nkey = "sk-{name}"\npriority = {p}\n' for name, p in (("quiet", -1), ("flood", 0)))
    return (f'[server]\nhealth_interval_s = 0\n{keys}[server.flow_control]\nenabled = true\n\n[plugins]\ndisable = ["builtin"]\n\n'
            f'[[backends]]\nname = "fleet"\ntype = "vllm"\n[backends.flow_control]\nisolate_top_band_prefill = {str(isolate).lower()}\n'
            f'[backends.options]\nendpoints = {json.dumps([up.url for up in ups])}\nbalance = "least_busy"\nmodels = {{ "m" = "up" }}\n')


def landed(ups: list[FaultyUpstream], request_id: str) -> str | None:
    for up in ups:
        if up.request(request_id) is not None:
            return up.url
    return None


async def placements(base: str, ups: list[FaultyUpstream], tag: str) -> tuple[str, list[str]]:
    """Where the top-band request went, and where each flood request went while it prefilled."""
    async with httpx.AsyncClient(base_url=base, timeout=60, trust_env=False) as client:
        async def send(key: str, request_id: str, text: str) -> None:
            body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 4, "stream": True}
            response = await client.post("/v1/chat/completions", json=body,
                                         headers={"authorization": f"Bearer sk-{key}", "x-request-id": request_id})
            assert response.status_code == 200 and b"[DONE]" in response.content

        async def arrived(request_id: str) -> str:
            ok = await asyncio.to_thread(wait_until, lambda: landed(ups, request_id) is not None, timeout=20, interval=0.01)
            assert ok, f"{request_id} never reached an upstream"
            return landed(ups, request_id)  # type: ignore[return-value]

        tasks = [asyncio.create_task(send("quiet", f"{tag}-quiet", f"pace:{PREFILL_MS}"))]
        quiet_on = await arrived(f"{tag}-quiet")
        floods = []
        for i in range(FLOODS):
            tasks.append(asyncio.create_task(send("flood", f"{tag}-flood-{i}", "batch pace:300")))
            floods.append(await arrived(f"{tag}-flood-{i}"))
        assert not tasks[0].done(), "the top-band request had its answer before the floods were placed: too slow a machine"
        await asyncio.gather(*tasks)
        return quiet_on, floods


@pytest.mark.parametrize("isolate", [True, False])
def test_a_top_band_prefill_keeps_the_band_below_off_its_replica(upstreams: list[FaultyUpstream], tmp_path: Path,
                                                                 isolate: bool) -> None:
    with running_server(config(upstreams, isolate), tmp_path) as base:
        quiet_on, floods = asyncio.run(placements(base, upstreams, f"isolate-{isolate}"))
    if isolate:
        assert quiet_on not in floods, f"a flood request was placed beside the top-band prefill: {floods}"
    else:
        assert quiet_on in floods  # least_busy alone balances in-flight counts: one lands beside it
