"""Aborts that arrive while a step runs take effect between two layers of its forward: the
request's rows leave the batch, its blocks are freed before the step ends, and its batch mates
go on unharmed (still token-exact)."""

from __future__ import annotations

import random

from builtin_engine.scheduling.sampling_params import SamplingParams
from tests.builtin_engine.conftest import collect

MAX_NEW = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5, 1000) for _ in range(n)]


def abort_during_layer(engine, request_id: str, *, layer: int = 0) -> list[int]:  # noqa: ANN001
    """Make the next step call `engine.abort(request_id)` while decoder layer `layer` runs, as a
    client going away mid-step would; return the free-block counts seen by each later layer."""
    model = engine.runner.model
    assert model.num_layers > layer + 1, "the abort must have a later layer to take effect before"
    original = model.layer
    free_blocks: list[int] = []

    def layer_hook(index, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if index > layer:
            free_blocks.append(engine.block_manager.num_free_blocks)
        out = original(index, *args, **kwargs)
        if index == layer:
            engine.abort(request_id)
        return out

    model.layer = layer_hook
    engine.step()
    model.layer = original
    return free_blocks


def test_abort_mid_decode_step_frees_blocks_before_the_step_ends(make_engine, hf_tiny) -> None:  # noqa: ANN001
    engine = make_engine(block_size=4, max_num_batched_tokens=64)
    prompts = [prompt(1, 9), prompt(2, 13), prompt(3, 6)]
    handles = [engine.add_request(p, GREEDY) for p in prompts]
    engine.step()  # prefill all three (each samples its first token)
    engine.step()  # a decode step
    victim = handles[1]
    victim_blocks = len(engine._requests[victim.request_id].seqs[0].block_table)
    free_before = engine.block_manager.num_free_blocks

    free_seen = abort_during_layer(engine, victim.request_id)

    # freed before layer 1 ran, in the middle of the step
    assert free_seen[0] == free_before + victim_blocks
    assert engine.last_step.num_sampled == 2
    assert len(engine.abort_latencies) == 1 and engine.abort_latencies[0] < 1.0
    assert victim.request_id not in engine._requests
    engine.run_until_done()
    for index in (0, 2):
        tokens, _, _ = collect(handles[index])
        assert tokens[0] == hf_tiny.greedy(prompts[index], MAX_NEW)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_abort_mid_prefill_chunk_keeps_the_decoders_going(make_engine, hf_tiny) -> None:  # noqa: ANN001
    """A long prompt prefilled in chunks beside decoding requests is aborted during a chunk."""
    engine = make_engine(block_size=4, max_num_batched_tokens=24)
    short = [prompt(4, 5), prompt(5, 7)]
    handles = [engine.add_request(p, GREEDY) for p in short]
    engine.step()
    long_handle = engine.add_request(prompt(6, 80), GREEDY)
    engine.step()  # decodes + the first chunk of the long prompt
    assert engine.last_step.num_prefill_seqs == 1 and engine.last_step.num_decode_seqs == 2

    abort_during_layer(engine, long_handle.request_id)

    stats = engine.last_step
    assert stats.num_sampled == 2  # the decoders sampled; the aborted chunk did not count
    engine.run_until_done()
    for p, handle in zip(short, handles):
        tokens, _, _ = collect(handle)
        assert tokens[0] == hf_tiny.greedy(p, MAX_NEW)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_abort_of_the_whole_batch_ends_the_step_early(make_engine) -> None:  # noqa: ANN001
    engine = make_engine(block_size=4)
    handle = engine.add_request(prompt(7, 30), GREEDY)
    abort_during_layer(engine, handle.request_id)
    assert engine.last_step.num_sampled == 0
    assert not engine.has_work()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_abort_of_a_waiting_request_during_a_step(make_engine) -> None:  # noqa: ANN001
    """Requests added during a step are admitted at the next poll; aborting one of them then
    takes it out of the queue (nothing was allocated)."""
    engine = make_engine(block_size=4, max_num_seqs=1)
    running = engine.add_request(prompt(8, 10), GREEDY)
    engine.step()
    waiting = engine.add_request(prompt(9, 10), GREEDY)
    abort_during_layer(engine, waiting.request_id)
    assert waiting.request_id not in engine._requests
    assert engine.last_step.num_sampled == 1  # the running request was untouched
    engine.run_until_done()
    tokens, _, _ = collect(running)
    assert len(tokens[0]) == MAX_NEW
