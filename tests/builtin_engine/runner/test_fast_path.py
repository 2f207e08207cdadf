"""The CPU fast path (`dtype = "bfloat16"`, every step compiled by torch.compile): compiled
and eager steps agree within bfloat16 tolerance; a batch of mixed lengths under preemption and
prefix-cache hits gives the same tokens as one prompt at a time; on the default model the greedy
tokens follow a bfloat16 transformers run's.

The compiled engines are small (tiny model, a few rows) and built once per module; inductor's code
is cached under ~/.cache/switchyard/compile, so a warm machine loads it instead of compiling.
"""

from __future__ import annotations

import pytest
import torch

from builtin_engine.runner.device import resolve_placement
from builtin_engine.runner.step_graph import CompiledStep
from builtin_engine.scheduling.sampling_params import SamplingParams
from builtin_engine.scheduling.scheduler import ScheduledChunk
from builtin_engine.scheduling.sequence import Sequence
from tests.builtin_engine.conftest import HFReference, collect
from tests.builtin_engine.test_hf_parity import TINY_LENGTHS, make_prompts, run_staggered

if not resolve_placement("cpu", "bfloat16").compile:
    pytest.skip("no C++ compiler or no C++ CPU kernels: the fast path runs eagerly", allow_module_level=True)

MAX_NEW = 32
BATCH_NEW = 20  # the longest prompt (91 tokens) + 20 fits max_model_len
# preemption: 14 blocks of 8 = 112 tokens for 8 prompts of up to 123 tokens
PREEMPTING = dict(dtype="bfloat16", max_num_batched_tokens=24, block_size=8, kv_cache_tokens=112,
                  max_model_len=112, max_num_seqs=8)


@pytest.fixture(scope="module")
def compiled_engine(make_engine):  # noqa: ANN001, ANN201
    return make_engine(compile=True, **PREEMPTING)


@pytest.fixture(scope="module")
def eager_engine(make_engine):  # noqa: ANN001, ANN201
    return make_engine(compile=False, **PREEMPTING)


def _random_cache(kv_cache, g: torch.Generator) -> None:  # noqa: ANN001
    for layer in kv_cache.keys + kv_cache.values:
        layer.copy_(torch.randn(layer.shape, generator=g).to(layer.dtype))


def test_compiled_and_eager_mixed_steps_give_the_same_logits(compiled_engine) -> None:  # noqa: ANN001
    """The whole-step graph on a step of decode rows and prefill chunks after cached context,
    on shuffled block tables, against the eager layer loop over the same chunks."""
    runner = compiled_engine.runner
    graph = runner.step_graph
    assert isinstance(graph, CompiledStep) and runner.decode_graph is None
    g = torch.Generator().manual_seed(11)
    _random_cache(runner.kv_cache, g)
    blocks = torch.randperm(runner.kv_cache.pad_block, generator=g).tolist()
    block_size = compiled_engine.config.block_size
    chunks = []
    # (tokens in the sequence, tokens computed this step): three decodes, then two prefill chunks;
    # 14 blocks, the whole cache
    for index, (length, new) in enumerate([(1, 1), (9, 1), (20, 1), (13, 13), (41, 7)]):
        seq = Sequence(seq_id=index, request_id=f"r{index}", index=0,
                       prompt_ids=[int(t) for t in torch.randint(3, 200, (length,), generator=g)],
                       params=SamplingParams(temperature=0.0), priority=0, arrival=index, seed=0, max_tokens=4)
        seq.block_table = [blocks.pop() for _ in range(-(-length // block_size))]
        chunks.append(ScheduledChunk(seq, length - new, new))
    with torch.inference_mode():
        compiled = graph.run(chunks)
        inputs = runner.prepare_inputs(chunks)
        hidden = runner.model.forward(inputs.input_ids, inputs.meta, runner.kv_cache)
        eager = runner.model.compute_logits(hidden)
    assert compiled is not None and compiled.shape == eager.shape == (len(chunks), eager.shape[1])
    torch.testing.assert_close(compiled, eager, rtol=2e-2, atol=2e-2 * eager.abs().max().item())
    assert (compiled.argmax(-1) == eager.argmax(-1)).float().mean() >= 0.8


@pytest.mark.parametrize("engine_name", ["eager_engine", "compiled_engine"])
def test_batch_under_preemption_and_prefix_hits_gives_one_at_a_time_tokens(engine_name: str, request) -> None:  # noqa: ANN001
    engine = request.getfixturevalue(engine_name)
    prompts = make_prompts(engine.model_config.vocab_size, TINY_LENGTHS)
    params = SamplingParams(temperature=0.0, max_tokens=BATCH_NEW)  # as run_staggered
    alone = []
    for prompt in prompts:
        handle = engine.add_request(prompt, params)
        while engine.has_work():
            engine.step()
        alone.append(collect(handle)[0][0])
    graph_steps = engine.runner.num_graph_steps
    handles, run = run_staggered(engine, prompts, BATCH_NEW)
    batched = [collect(handle)[0][0] for handle in handles]
    assert run.num_preempted > 0 and run.saw_mixed_step
    assert batched == alone
    if engine_name == "compiled_engine":
        assert engine.runner.num_graph_steps > graph_steps  # the compiled step ran in the batch
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


# ---- the real default model -------------------------------------------------------------------


def _tie_gap(model, ids: list[int]) -> float:  # noqa: ANN001
    """transformers' bfloat16 next-token logits after `ids`: the gap between its top two, in
    units of one bfloat16 ulp at the top logit's magnitude (0: an exact tie)."""
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0, -1].float()
    top = logits.topk(2).values
    ulp = 2.0 ** (torch.floor(torch.log2(top[0].abs())).item() - 7)
    return (top[0] - top[1]).item() / ulp


@pytest.mark.slow
def test_default_model_follows_transformers_in_bfloat16(make_engine, default_model_dir) -> None:  # noqa: ANN001
    """Every prompt follows transformers' bfloat16 greedy tokens for all MAX_NEW tokens, or leaves
    them where transformers itself stands at a tie (its top two logits within one bfloat16 ulp,
    which the last bits of attention's exp and summation order may break either way; transformers'
    own eager attention leaves its sdpa tokens on 5 of these 8 prompts: bench/bf16_parity.py).
    The first divergence positions and transformers' top-two gaps there are printed."""
    from bench.bf16_parity import chat_prompts

    prompts = chat_prompts(str(default_model_dir))
    hf = HFReference(default_model_dir, dtype=torch.bfloat16)
    engine = make_engine(default_model_dir, dtype="bfloat16", compile=False, max_num_batched_tokens=64)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    handles = [engine.add_request(prompt, params) for prompt in prompts]
    while engine.has_work():
        engine.step()
    firsts, gaps = [], []
    for prompt, handle in zip(prompts, handles):
        ours, ref = collect(handle)[0][0], hf.greedy(prompt, MAX_NEW, ignore_eos=True)
        first = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), MAX_NEW)
        firsts.append(first)
        gaps.append(None if first == MAX_NEW else _tie_gap(hf.model, prompt + ref[:first]))
    print("first divergence per prompt:", firsts, "transformers' top-2 gap there (bf16 ulps):", gaps)
    assert all(first == MAX_NEW or gap <= 1 for first, gap in zip(firsts, gaps)), (firsts, gaps)
