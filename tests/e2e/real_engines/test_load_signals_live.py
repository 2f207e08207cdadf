"""The load signals live, against the real servers of this session: each engine's own report,
scraped by the backend's background loop, shows a request while it runs and none after."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from engines.launch import ServerProcess
from plugins.contract.protocol import RequestSpec, Sampling
from plugins.proxy.llamacpp import LlamaCppBackend, LlamaCppOptions
from plugins.proxy.vllm import VLLMBackend, VLLMOptions
from tests.e2e.real_engines.conftest import MODEL
from tests.support.probes import wait_until_async


async def _until(check, timeout: float = 30.0) -> bool:  # noqa: ANN001
    return await wait_until_async(check, timeout)


def test_engine_load_is_scraped_live(engine: str, engine_servers: dict[str, ServerProcess]) -> None:
    url = engine_servers[engine].base_url
    options = {"base_url": url, "load_signals": {"interval_s": 0.2}}
    backend = (VLLMBackend("v", msgspec.convert(options, VLLMOptions)) if engine == "vllm"
               else LlamaCppBackend("l", msgspec.convert(options, LlamaCppOptions)))
    spec = RequestSpec(request_id="live-load", kind="chat", model=MODEL, upstream_model=MODEL,
                       sampling=Sampling(temperature=0.0, max_tokens=400, ignore_eos=True),
                       messages=[{"role": "user", "content": "Tell a very long story about trains."}])

    async def go() -> None:
        await backend.start()
        try:
            (replica,) = backend.fleet.replicas.values()
            assert await _until(lambda: replica.snapshot is not None), "no scrape arrived"
            events = backend.generate(spec)
            await anext(events)  # the request is running now
            assert await _until(lambda: replica.snapshot.running >= 1), replica.snapshot
            assert replica.load() >= 1
            (stats,) = backend.replica_stats()
            assert not stats.stale and stats.running >= 1
            assert (stats.kv_cache_usage is not None) == (engine == "vllm")  # llama.cpp's /metrics has none
            await events.aclose()  # cancels upstream
            assert await _until(lambda: replica.snapshot.running == 0 and replica.snapshot.waiting == 0)
            if engine == "vllm":
                assert replica.snapshot.cache_tokens and replica.snapshot.cache_tokens > 0
        finally:
            await backend.close()

    asyncio.run(go())


@pytest.mark.parametrize("source", ["llamacpp_slots"])
def test_llamacpp_slots_live(source: str, engine_servers: dict[str, ServerProcess]) -> None:
    if "llamacpp" not in engine_servers:
        pytest.skip("llama.cpp is not installed")
    options = {"base_url": engine_servers["llamacpp"].base_url, "load_signals": {"source": source, "interval_s": 0.2}}
    backend = LlamaCppBackend("l", msgspec.convert(options, LlamaCppOptions))

    async def go() -> None:
        await backend.start()
        try:
            (replica,) = backend.fleet.replicas.values()
            assert await _until(lambda: replica.snapshot is not None)
            assert replica.snapshot.cache_tokens == 4096 and replica.load_source == 0
        finally:
            await backend.close()

    asyncio.run(go())
