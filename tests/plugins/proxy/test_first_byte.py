"""The fleet hears when a proxied answer begins (`Fleet.first_byte`): against the recording
faulty upstream, whose `pace:` sends the response head at once and each event later (as vLLM
does while it prefills), a request counts as in its prefill on its replica from the moment it is
placed until its first body bytes arrive — not at the head — and a top-band one
(`RequestSpec.top_band`) keeps others off that replica for exactly that long; a request that
fails before any byte leaves nothing behind."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import msgspec
import pytest

from plugins.contract.errors import UpstreamError
from plugins.contract.protocol import RequestSpec, Sampling, Usage
from plugins.proxy.vllm import VLLMBackend, VLLMOptions
from tests.support import faulty_upstream
from tests.support.faulty_upstream import FaultyUpstream

pytestmark = pytest.mark.anyio
PACE_MS = 400


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultyUpstream]:
    up = faulty_upstream.start()
    try:
        yield up
    finally:
        faulty_upstream.stop(up)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def spec(text: str, *, top_band: bool = False) -> RequestSpec:
    return RequestSpec(request_id="r", kind="chat", model="m", upstream_model="up", sampling=Sampling(max_tokens=8),
                       messages=[{"role": "user", "content": text}], stream=True, top_band=top_band)


@pytest.mark.parametrize("top_band", [False, True])
async def test_a_request_is_in_its_prefill_until_its_first_bytes(upstream: FaultyUpstream, top_band: bool) -> None:
    backend = VLLMBackend("fleet", msgspec.convert({"endpoints": [upstream.url], "models": {"m": "up"}}, VLLMOptions))
    await backend.start()
    try:
        replica = backend.fleet.replicas[upstream.url]
        stream = backend.generate(spec(f"two words pace:{PACE_MS}", top_band=top_band))
        first = asyncio.ensure_future(stream.__anext__())
        loop = asyncio.get_running_loop()
        started = loop.time()
        while replica.in_flight == 0:  # placed, and (within ms) its head is in: events come PACE_MS apart
            await asyncio.sleep(0.005)
        await asyncio.sleep(PACE_MS / 4000)
        assert not first.done() and len(replica.prefilling) == 1
        assert replica.prefills_top_band() is top_band
        await first
        assert loop.time() - started >= PACE_MS / 1000 * 0.9
        assert replica.prefilling == {} and replica.in_flight == 1  # its prefill is over; it still runs
        events = [event async for event in stream]
        assert isinstance(events[-1], Usage) and replica.in_flight == 0
    finally:
        await backend.close()


async def test_a_failure_before_any_byte_leaves_no_prefill_behind(upstream: FaultyUpstream) -> None:
    backend = VLLMBackend("fleet", msgspec.convert({"endpoints": [upstream.url], "models": {"m": "up"}}, VLLMOptions))
    await backend.start()
    try:
        replica = backend.fleet.replicas[upstream.url]
        with pytest.raises(UpstreamError):
            [event async for event in backend.generate(spec("fault:status:503", top_band=True))]
        with pytest.raises(UpstreamError):
            [event async for event in backend.generate(spec("fault:die_mid_stream", top_band=True))]
        assert replica.prefilling == {} and replica.in_flight == 0
    finally:
        await backend.close()
