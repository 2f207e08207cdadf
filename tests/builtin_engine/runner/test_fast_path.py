"""The CPU fast path (`dtype = "bfloat16"`, every step compiled by torch.compile): compiled
and eager steps agree within bfloat16 tolerance; a batch of mixed lengths under preemption and
prefix-cache hits gives the same tokens as one prompt at a time; on the default model the greedy
tokens follow a bfloat16 transformers run's.

The compiled engines are small (tiny model, a few rows) and built once per module; inductor's code
is cached under ~/.cache/switchyard/compile, so a warm machine loads it instead of compiling.
"""

from __future__ import annotations

import math

import pytest
import torch

from builtin_engine.runner.device import resolve_placement
from builtin_engine.runner.step_graph import CompiledStep
from builtin_engine.scheduling.sampling_params import SamplingParams
from builtin_engine.scheduling.scheduler import ScheduledChunk
from builtin_engine.scheduling.sequence import Sequence
from tests.builtin_engine.conftest import collect
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


def _ulp(value: float) -> float:
    """One bfloat16 ulp at `value`'s magnitude."""
    return 2.0 ** (math.floor(math.log2(abs(value))) - 7)


def _greedy_logits(model, prompt: list[int], new_tokens: int) -> tuple[list[int], torch.Tensor]:  # noqa: ANN001
    """transformers' greedy tokens (the end token allowed, not stopping) and the logits `generate`
    chose each from, [new_tokens, V] float32."""
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             do_sample=False, max_new_tokens=new_tokens, eos_token_id=None, top_k=None, top_p=None,
                             temperature=None, output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, len(prompt):].tolist(), torch.cat(out.logits).float()


def _first_divergence(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), MAX_NEW)


def _margin_shifts(ref: list[int], ref_logits: torch.Tensor, other: list[int],
                   other_logits: torch.Tensor) -> list[float]:
    """At every step where `other` has the same tokens before it as `ref`: how far `other`'s
    logits move the margin between `ref`'s top two tokens, in bfloat16 ulps at the top logit (inf
    where `other` lacks one of the two: our logprobs hold only the top 20)."""
    shifts = []
    for r, o in zip(ref_logits[:_first_divergence(ref, other) + 1], other_logits):
        top = r.topk(2)
        a, b = top.indices.tolist()
        shift = abs(((o[a] - o[b]) - (r[a] - r[b])).item()) / _ulp(top.values[0].item())
        shifts.append(shift if math.isfinite(shift) else math.inf)
    return shifts


@pytest.mark.slow
def test_default_model_follows_transformers_in_bfloat16(make_engine, default_model_dir) -> None:  # noqa: ANN001
    """On the 8 chat prompts, against transformers' bfloat16 greedy `generate` (sdpa attention),
    with transformers' own eager attention as the measure of what bfloat16 leaves undecided:

    - every prompt follows transformers' tokens for all MAX_NEW tokens, or leaves them where our
      token's logit is within `tie` bfloat16 ulps of transformers' chosen one (in the logits
      `generate` chose from); `tie` is the largest amount by which transformers' eager attention
      moves the margin between sdpa's top two tokens over the steps they share, at least 1 (each
      logit is rounded to bfloat16: a 1-ulp gap is anything from 0 to 2 unrounded);
    - over the steps we share with transformers, we move that margin on average at most twice as
      much as its eager attention does (ours from our raw logprobs, the top 20).

    A bfloat16 forward's last bits (attention's exp and summation order; the GEMMs' accumulation
    order, which oneDNN picks per ISA) move top-two margins by several ulps, and which near-ties a
    run tips over is chance. On these prompts (bench/README.md, "bfloat16 parity on a Xeon with
    AMX"), margin shift max / mean: 2-core Xeon with AMX, transformers eager vs sdpa 5 / 0.62 ulps,
    transformers sdpa with AMX vs without (ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16) 3 / 0.58, ours vs
    sdpa 3 / 0.61; AMX off, eager vs sdpa 3 / 0.73, ours vs sdpa 3 / 0.62. There our layer 0 is
    bit-equal to transformers' up to attention (q after rope), whose output differs in the last bit
    in 251 of 15,552 values, AMX on or off, and our packed GEMMs give transformers' matmul bits. The
    fixed 1-ulp tie this test had held on the AMD EPYC by chance: here ours leaves a 2-ulp gap (AMX
    on), and the gap the test measured then, from a separate full forward rather than the logits
    `generate` chose from, read 2 ulps with AMX off where `generate` had an exact tie. A rope theta
    of 10,000 instead of the model's 100,000 fails both checks (a 7-ulp gap; mean shift 3.05, 5x
    transformers'), a norm without its weight fails at gaps of 58-253 ulps; an attention scale 1%
    high or the norm's variance summed in bfloat16 pass (divergences at gaps of 0-2 ulps, mean
    shift 0.73 and 0.68): below what bfloat16 greedy tokens resolve. The first divergences, the
    gaps there and both bounds are printed."""
    from transformers import AutoModelForCausalLM

    from bench.bf16_parity import chat_prompts

    prompts = chat_prompts(str(default_model_dir))
    engine = make_engine(default_model_dir, dtype="bfloat16", compile=False, max_num_batched_tokens=64)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=True, top_logprobs=20)
    handles = [engine.add_request(prompt, params) for prompt in prompts]
    while engine.has_work():
        engine.step()
    ours = []
    for handle in handles:
        steps = [lp for out in collect(handle)[2] for choice in out.choices for lp in choice.logprobs or ()]
        logits = torch.full((len(steps), engine.model_config.vocab_size), -math.inf)
        for row, step in zip(logits, steps):
            row[[t for t, _ in step.top]] = torch.tensor([v for _, v in step.top])
        ours.append(([step.token_id for step in steps], logits))
    runs = {}
    for attention in ("sdpa", "eager"):
        model = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.bfloat16,
                                                     attn_implementation=attention).eval()
        runs[attention] = [_greedy_logits(model, prompt, MAX_NEW) for prompt in prompts]
    theirs = [s for ref, other in zip(runs["sdpa"], runs["eager"]) for s in _margin_shifts(*ref, *other)]
    mine = [s for ref, other in zip(runs["sdpa"], ours) for s in _margin_shifts(*ref, *other)]
    tie = max(1.0, *theirs)
    firsts, gaps = [], []
    for (tokens, _), (ref, logits) in zip(ours, runs["sdpa"]):
        first = _first_divergence(tokens, ref)
        firsts.append(first)
        if first == MAX_NEW:
            gaps.append(None)
        else:
            chosen, taken = logits[first, ref[first]].item(), logits[first, tokens[first]].item()
            gaps.append((chosen - taken) / _ulp(chosen))
    mean_theirs, mean_mine = sum(theirs) / len(theirs), sum(mine) / len(mine)
    print("first divergence per prompt:", firsts, "transformers' gap to our token there (bf16 ulps):", gaps,
          f"tie {tie}; mean margin shift: ours {mean_mine:.2f}, transformers eager {mean_theirs:.2f}; eager's first"
          " divergence from sdpa:", [_first_divergence(e, r) for (e, _), (r, _) in zip(runs["eager"], runs["sdpa"])])
    assert all(first == MAX_NEW or gap <= tie for first, gap in zip(firsts, gaps)), (firsts, gaps, tie)
    assert mean_mine <= 2 * mean_theirs, (mean_mine, mean_theirs)
