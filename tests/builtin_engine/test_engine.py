"""The engine as a whole: priority under load, preemption victims, the bounded queue, the
context-length check, the step thread with the asyncio API, abort, liveness."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from builtin_engine.errors import ContextLengthExceeded, EngineDeadError, InvalidRequestError, QueueFull
from builtin_engine.scheduling.sampling_params import SamplingParams
from tests.builtin_engine.conftest import collect

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def prompt(seed: int, n: int = 8) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5, 1000) for _ in range(n)]


def test_priority_order_under_load(make_engine) -> None:  # noqa: ANN001
    engine = make_engine(max_num_seqs=1)
    started: list[str] = []
    handles = {"a": engine.add_request(prompt(1), GREEDY, priority=5)}
    engine.step()  # a runs; everything else has to wait for the one slot
    handles["b"] = engine.add_request(prompt(2), GREEDY, priority=5)
    handles["c"] = engine.add_request(prompt(3), GREEDY, priority=0)
    handles["d"] = engine.add_request(prompt(4), GREEDY, priority=0)
    handles["e"] = engine.add_request(prompt(5), GREEDY, priority=-3)
    seen: set[str] = set()
    started.append("a")
    seen.add("a")
    while engine.has_work():
        engine.step()
        for name, h in handles.items():
            if name not in seen and h.has_output:
                seen.add(name)
                started.append(name)
    assert started == ["a", "e", "c", "d", "b"]


def test_preemption_takes_the_lowest_priority_first(make_engine) -> None:  # noqa: ANN001
    engine = make_engine(block_size=4, kv_cache_tokens=48, max_model_len=48, max_num_batched_tokens=64)
    preempted: list[int] = []
    original = engine.scheduler._preempt

    def spy(seq) -> None:  # noqa: ANN001
        preempted.append(seq.priority)
        original(seq)

    engine.scheduler._preempt = spy
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    handles = [engine.add_request(prompt(10 + i, 10), params, priority=p) for i, p in enumerate([0, 2, 1])]
    engine.run_until_done()
    assert preempted and preempted[0] == 2
    assert 0 not in preempted  # the most important request ran straight through
    for h in handles:
        tokens, _, _ = collect(h)
        assert len(tokens[0]) == 20


def test_queue_full_raises_and_frees_on_schedule_or_abort(make_engine) -> None:  # noqa: ANN001
    engine = make_engine(max_waiting=2, max_num_seqs=1)
    first = engine.add_request(prompt(1), GREEDY)
    second = engine.add_request(prompt(2), GREEDY)
    with pytest.raises(QueueFull):
        engine.add_request(prompt(3), GREEDY)
    engine.step()  # first is scheduled: one place in the queue frees up
    third = engine.add_request(prompt(3), GREEDY)
    with pytest.raises(QueueFull):
        engine.add_request(prompt(4), GREEDY)
    engine.abort(third.request_id)
    engine.step()
    engine.add_request(prompt(4), GREEDY)
    engine.run_until_done()
    assert collect(first)[0][0] and collect(second)[0][0]


def test_context_length_checked_before_scheduling(make_engine) -> None:  # noqa: ANN001
    engine = make_engine(max_model_len=64)
    with pytest.raises(ContextLengthExceeded) as info:
        engine.add_request(prompt(1, 50), SamplingParams(max_tokens=20))
    assert "64" in str(info.value) and "50" in str(info.value) and "20" in str(info.value)
    with pytest.raises(ContextLengthExceeded):
        engine.add_request(prompt(1, 64), SamplingParams())  # no room for even one token
    with pytest.raises(InvalidRequestError):
        engine.add_request([], SamplingParams())
    with pytest.raises(InvalidRequestError):
        engine.add_request([10**6], SamplingParams())
    assert engine.num_unfinished_requests == 0 and not engine.has_work()
    # max_tokens None: the rest of the context
    handle = engine.add_request(prompt(1, 60), SamplingParams(temperature=0.0, ignore_eos=True))
    engine.run_until_done()
    tokens, _, outs = collect(handle)
    assert len(tokens[0]) == 4 and outs[-1].choices[-1].finish_reason == "length"


def test_step_thread_async_api_abort_and_shutdown(make_engine) -> None:  # noqa: ANN001
    engine = make_engine()
    engine.start()
    try:
        assert engine.is_alive()

        async def full(seed: int) -> list[int]:
            tokens: list[int] = []
            async for out in engine.generate(prompt(seed, 12), SamplingParams(temperature=0.0, max_tokens=8,
                                                                               ignore_eos=True)):
                tokens.extend(t for c in out.choices for t in c.token_ids)
            return tokens

        async def abandoned() -> float:
            stream = engine.generate(prompt(99, 12), SamplingParams(temperature=0.0, max_tokens=10_000 // 10,
                                                                     ignore_eos=True))
            async for _ in stream:
                break
            await stream.aclose()  # closing the iterator aborts the request
            closed_at = time.monotonic()
            while engine.num_unfinished_requests:
                await asyncio.sleep(0.005)
            return time.monotonic() - closed_at

        async def main() -> tuple[list[list[int]], float]:
            results = await asyncio.gather(full(1), full(2), full(3), abandoned())
            return list(results[:3]), results[3]

        outputs, abort_latency = asyncio.run(main())
        assert all(len(t) == 8 for t in outputs)
        assert abort_latency < 0.5
        time.sleep(0.05)
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    finally:
        engine.shutdown()
    assert not engine.is_alive()
    with pytest.raises(EngineDeadError):
        engine.add_request(prompt(1), GREEDY)


def test_crash_in_step_fails_requests_and_liveness(make_engine) -> None:  # noqa: ANN001
    engine = make_engine()

    def boom(chunks, **kwargs) -> None:  # noqa: ANN001, ANN003
        raise RuntimeError("kaboom")

    engine.runner.execute = boom
    engine.start()

    async def main() -> None:
        with pytest.raises(EngineDeadError, match="kaboom"):
            async for _ in engine.generate(prompt(1), GREEDY):
                pass

    asyncio.run(main())
    engine._thread.join(5)
    assert not engine.is_alive()
