"""Token-exact greedy parity with Hugging Face transformers on the same weights.

The engine batches: prompts arrive staggered while others decode, prefill runs in small chunks,
several prompts share a prefix; the reference runs `generate(do_sample=False)` one prompt at a
time. The same again with a KV cache small enough to force preemption, and with a repeated
prefix served from the prefix cache. On the tiny random model and on the real default model.
The preempting batch and the default model's batch run compiled too (`compile = true`: every step
through the step graph), one compiled engine each: a cold compile takes ~20 s (tiny) and ~50 s
(default model), a warm cache (~/.cache/switchyard/compile) ~4 s and ~11 s.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

import kernels
from builtin_engine.scheduling.sampling_params import SamplingParams
from tests.builtin_engine.conftest import HFReference, collect

MAX_NEW = 12
EAGER_AND_COMPILED = pytest.mark.parametrize("compile", [
    pytest.param(False, id="eager"),
    pytest.param(True, id="compiled", marks=pytest.mark.skipif(
        not kernels.has_cpu_kernels(), reason="the step graph needs the C++ kernels (and a C++ compiler)")),
])


@dataclass
class Run:
    outputs: list  # the last RequestOutput of each prompt
    saw_mixed_step: bool = False  # a step held decode rows and prefill chunks together
    saw_chunked_prefill: bool = False  # a prompt took more than one step to prefill
    num_preempted: int = 0


def make_prompts(vocab_size: int, lengths: list[int], *, seed: int = 1234, shared_len: int = 21) -> list[list[int]]:
    """Prompts of the given tail lengths; every other one starts with a shared prefix."""
    rng = random.Random(seed)
    shared = [rng.randrange(5, vocab_size) for _ in range(shared_len)]
    prompts = []
    for i, n in enumerate(lengths):
        tail = [rng.randrange(5, vocab_size) for _ in range(n)]
        prompts.append(shared + tail if i % 2 == 0 else tail)
    return prompts


def run_staggered(engine, prompts: list[list[int]], max_new: int) -> tuple[list, Run]:  # noqa: ANN001
    """Two new prompts every other step while stepping the engine by hand."""
    params = SamplingParams(temperature=0.0, max_tokens=max_new)
    run = Run(outputs=[])
    handles, pending, step = [], list(prompts), 0
    while pending or engine.has_work():
        if pending and step % 2 == 0:
            handles.extend(engine.add_request(pending.pop(0), params) for _ in range(min(2, len(pending))))
        engine.step()
        stats = engine.last_step
        run.saw_mixed_step |= stats.num_decode_seqs > 0 and stats.num_prefill_seqs > 0
        run.saw_chunked_prefill |= stats.num_prefill_seqs > stats.num_sampled - stats.num_decode_seqs
        run.num_preempted += stats.num_preempted
        step += 1
    return handles, run


def check_parity(engine, hf: HFReference, prompts: list[list[int]], max_new: int = MAX_NEW) -> Run:  # noqa: ANN001
    steps, graph_steps = engine.num_steps, engine.runner.num_graph_steps
    handles, run = run_staggered(engine, prompts, max_new)
    for prompt, handle in zip(prompts, handles):
        tokens, _, outs = collect(handle)
        assert tokens[0] == hf.greedy(prompt, max_new), f"the prompt of {len(prompt)} tokens diverged"
        assert outs[-1].num_prompt_tokens == len(prompt)
        run.outputs.append(outs[-1])
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks  # all freed
    if engine.placement.compile:  # every step ran in the graph, none fell back to eager
        assert engine.runner.num_graph_steps - graph_steps == engine.num_steps - steps > 0
    return run


TINY_LENGTHS = [3, 40, 7, 1, 70, 18, 33, 9]


def test_tiny_batched_chunked_matches_transformers(make_engine, hf_tiny) -> None:  # noqa: ANN001
    engine = make_engine(max_num_batched_tokens=24, block_size=16, kv_cache_tokens=4096)
    prompts = make_prompts(engine.model_config.vocab_size, TINY_LENGTHS)
    run = check_parity(engine, hf_tiny, prompts)
    assert run.saw_mixed_step and run.saw_chunked_prefill and run.num_preempted == 0


@EAGER_AND_COMPILED
def test_tiny_preemption_matches_transformers(make_engine, hf_tiny, compile: bool) -> None:  # noqa: ANN001
    # 14 blocks of 8 = 112 tokens for 8 prompts of up to 103 tokens: constant preemption.
    engine = make_engine(max_num_batched_tokens=24, block_size=8, kv_cache_tokens=112, max_model_len=112,
                         compile=compile)
    prompts = make_prompts(engine.model_config.vocab_size, TINY_LENGTHS)
    run = check_parity(engine, hf_tiny, prompts)
    assert run.num_preempted > 0 and run.saw_mixed_step and run.saw_chunked_prefill


def test_tiny_prefix_cache_hits_match_transformers(make_engine, hf_tiny) -> None:  # noqa: ANN001
    engine = make_engine(max_num_batched_tokens=32, block_size=8, kv_cache_tokens=2048)
    vocab = engine.model_config.vocab_size
    first = make_prompts(vocab, [30], shared_len=40)
    check_parity(engine, hf_tiny, first)
    # Same 40-token prefix later, different tails: the prefix comes from the cache.
    later = make_prompts(vocab, [5, 0, 17], shared_len=40)
    later = [p for p in later if len(p) > 40]
    run = check_parity(engine, hf_tiny, later)
    assert all(out.num_cached_tokens == 40 for out in run.outputs)
    # A repeat of a whole prompt: every full block but the one holding the last token.
    run = check_parity(engine, hf_tiny, first)
    assert run.outputs[0].num_cached_tokens == (len(first[0]) - 1) // 8 * 8


def test_tiny_tied_embeddings_match_transformers(make_engine, tiny_model_dir_tied) -> None:  # noqa: ANN001
    engine = make_engine(tiny_model_dir_tied, max_num_batched_tokens=32, block_size=16)
    prompts = make_prompts(engine.model_config.vocab_size, [5, 30])
    check_parity(engine, HFReference(tiny_model_dir_tied), prompts, max_new=6)


# ---- the real default model -------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_default(default_model_dir) -> HFReference:  # noqa: ANN001
    return HFReference(default_model_dir)


@pytest.fixture(scope="module")
def default_prompts(default_model_dir) -> list[list[int]]:  # noqa: ANN001
    from builtin_engine.text.chat_template import ChatTemplate
    from builtin_engine.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(default_model_dir)
    template = ChatTemplate.from_dir(default_model_dir)
    system = {"role": "system", "content": "You are a concise assistant."}
    questions = ["What is the capital of France?", "Name a primary color.", "What is 2 + 2?"]
    return [
        tokenizer.encode(template.render([system, {"role": "user", "content": q}]), add_special_tokens=False)
        for q in questions
    ]


@pytest.mark.slow
@EAGER_AND_COMPILED
def test_default_model_batched_chunked_matches_transformers(make_engine, default_model_dir, hf_default,
                                                           default_prompts, compile: bool) -> None:  # noqa: ANN001
    engine = make_engine(default_model_dir, max_num_batched_tokens=20, block_size=8, kv_cache_tokens=1024,
                         compile=compile)
    run = check_parity(engine, hf_default, default_prompts, max_new=8)
    assert run.saw_mixed_step and run.saw_chunked_prefill
    # the prompts share the system prompt; the third arrives after the first's prefill began
    assert run.outputs[2].num_cached_tokens > 0


@pytest.mark.slow
def test_default_model_preemption_and_prefix_cache_match_transformers(make_engine, default_model_dir, hf_default,
                                                                      default_prompts) -> None:  # noqa: ANN001
    engine = make_engine(default_model_dir, max_num_batched_tokens=20, block_size=8, kv_cache_tokens=48,
                         max_model_len=48)
    run = check_parity(engine, hf_default, default_prompts, max_new=8)
    assert run.num_preempted > 0
    run = check_parity(engine, hf_default, default_prompts[:1], max_new=8)
    assert run.outputs[0].num_cached_tokens > 0
