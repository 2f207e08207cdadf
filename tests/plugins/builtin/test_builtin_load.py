"""The built-in engine stays one replica (`local`): its load is the scheduler's own state, read
directly (never stale), for `least_load` / `prefix_cache` across a route's targets and the
`switchyard_replica_*` gauges."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from plugins.builtin.backend import BuiltinBackend, BuiltinOptions
from plugins.contract.protocol import RequestSpec, Sampling, TextDelta, Usage


def test_builtin_load_is_the_scheduler_state(tiny_model_dir: Path) -> None:
    async def go() -> None:
        backend = BuiltinBackend("local", msgspec.convert(
            {"model": str(tiny_model_dir), "num_threads": 1, "kv_cache_tokens": 4096, "served_model_name": "tiny"},
            BuiltinOptions))
        await backend.start()
        try:
            (idle,) = backend.replica_stats()
            assert (idle.replica, idle.load, idle.running, idle.waiting, idle.stale) == ("local", 0.0, 0.0, 0.0, False)
            assert backend.load() == 0.0 and 0.0 <= idle.kv_cache_usage < 0.01
            spec = RequestSpec(request_id="r", kind="chat", model="tiny", upstream_model="tiny",
                               messages=[{"role": "user", "content": "Tell a long story."}],
                               sampling=Sampling(temperature=0.0, max_tokens=48, ignore_eos=True))
            events = backend.generate(spec)
            seen_busy = None
            async for event in events:
                if isinstance(event, TextDelta) and seen_busy is None:  # mid-stream: the request is unfinished
                    (seen_busy,) = backend.replica_stats()
                    assert backend.load() == 1.0
                if isinstance(event, Usage):
                    assert event.completion_tokens == 48
            assert seen_busy is not None and seen_busy.load == 1.0
            assert seen_busy.running + seen_busy.waiting == 1.0 and seen_busy.kv_cache_usage > 0.0
            (after,) = backend.replica_stats()
            assert backend.load() == 0.0 and after.running == 0.0
        finally:
            await backend.close()

    asyncio.run(go())


def test_builtin_load_with_the_engine_in_its_own_process(tiny_model_dir: Path) -> None:
    """In an engine process the scheduler's counts come with each health probe; between probes
    the load never reads below this worker's own open streams."""
    async def go() -> None:
        backend = BuiltinBackend("local", msgspec.convert(
            {"model": str(tiny_model_dir), "num_threads": 1, "kv_cache_tokens": 4096, "served_model_name": "tiny",
             "engine_process": True},
            BuiltinOptions))
        await backend.start()
        try:
            assert await backend.health()
            (idle,) = backend.replica_stats()
            assert (idle.load, idle.running, idle.stale, idle.healthy) == (0.0, 0.0, False, True)
            spec = RequestSpec(request_id="r", kind="chat", model="tiny", upstream_model="tiny",
                               messages=[{"role": "user", "content": "Tell a long story."}],
                               sampling=Sampling(temperature=0.0, max_tokens=48, ignore_eos=True))
            probed_busy = None
            async for event in backend.generate(spec):
                if isinstance(event, TextDelta) and probed_busy is None:
                    assert backend.load() >= 1.0  # the open stream counts before any probe
                    assert await backend.health()
                    (probed_busy,) = backend.replica_stats()
            assert probed_busy is not None and probed_busy.load == 1.0 and probed_busy.kv_cache_usage > 0.0
            assert await backend.health()
            assert backend.load() == 0.0 and backend.replica_stats()[0].running == 0.0
        finally:
            await backend.close()

    asyncio.run(go())


def test_the_engine_process_runs_with_the_backends_device_options(tiny_model_dir: Path) -> None:
    """`dtype` / `compile` reach an engine process the same as an in-process engine; both report
    where they run (the start-up log line)."""
    async def placement(engine_process: bool) -> str:
        backend = BuiltinBackend("local", msgspec.convert(
            {"model": str(tiny_model_dir), "num_threads": 1, "kv_cache_tokens": 1024, "served_model_name": "tiny",
             "dtype": "bfloat16", "compile": False, "engine_process": engine_process},
            BuiltinOptions))
        await backend.start()
        try:
            assert backend.engine is not None and backend.engine.info is not None
            return backend.engine.info.placement
        finally:
            await backend.close()

    in_process, own_process = asyncio.run(placement(False)), asyncio.run(placement(True))
    assert in_process == own_process and in_process.startswith("cpu (") and in_process.endswith(", bfloat16, eager")
