"""Pooling requests (embeddings) through the engine's scheduler, against Hugging Face
transformers' final hidden states of the same weights: last-token, mean and first-token pooling,
prompts prefilled in chunks while other prompts decode, the prefix cache, matryoshka
truncation, errors and aborts."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from builtin_engine.errors import InvalidRequestError
from builtin_engine.pooling import PoolingParams
from builtin_engine.scheduling.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def hf_hidden(tiny_model_dir: Path):  # noqa: ANN201
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()

    def hidden(prompt: list[int]) -> torch.Tensor:  # [T, H], after the final norm
        with torch.inference_mode():
            return model.model(torch.tensor([prompt])).last_hidden_state[0]

    return hidden


def reference(hidden: torch.Tensor, params: PoolingParams) -> list[float]:
    vector = {"last": hidden[-1], "mean": hidden.mean(dim=0), "cls": hidden[0]}[params.method]
    if params.dimensions is not None:
        vector = vector[: params.dimensions]
    return (torch.nn.functional.normalize(vector, dim=0) if params.normalize else vector).tolist()


def run(engine, prompts: list[list[int]], params: PoolingParams, *, with_generation: bool = True) -> list[list[float]]:  # noqa: ANN001
    """Pool every prompt, two new ones every other step, beside a generating request."""
    handles, pending, step = [], list(prompts), 0
    if with_generation:
        generating = engine.add_request([5, 6, 7, 8], SamplingParams(temperature=0.0, max_tokens=12))
    while pending or engine.has_work():
        if pending and step % 2 == 0:
            handles += [engine.add_pooling_request(pending.pop(0), params) for _ in range(min(2, len(pending)))]
        engine.step()
        step += 1
    if with_generation:
        outputs = []
        while not generating.finished:
            outputs.append(generating.get(timeout=10))
        assert outputs[-1].num_output_tokens == 12 and all(o.embedding is None for o in outputs)
    vectors = []
    for handle in handles:
        out = handle.get(timeout=10)
        assert out.finished and out.choices == [] and handle.finished
        vectors.append(out.embedding)
    return vectors


def prompts_of(vocab: int, lengths: list[int], seed: int = 7) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(n)] for n in lengths]


@pytest.mark.parametrize("method", ["last", "mean", "cls"])
def test_pooling_matches_transformers(make_engine, hf_hidden, method: str) -> None:  # noqa: ANN001
    engine = make_engine(max_num_batched_tokens=16, block_size=4, kv_cache_tokens=512)
    prompts = prompts_of(engine.model_config.vocab_size, [3, 17, 40, 9, 33])  # 17, 40, 33: several chunks
    params = PoolingParams(method=method)
    for prompt, vector in zip(prompts, run(engine, prompts, params)):
        assert vector == pytest.approx(reference(hf_hidden(prompt), params), abs=1e-4)
        assert sum(v * v for v in vector) == pytest.approx(1.0, rel=1e-5)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.parametrize("method", ["last", "mean"])
def test_prefix_cache_gives_the_same_vectors(make_engine, method: str) -> None:  # noqa: ANN001
    engine = make_engine(max_num_batched_tokens=64, block_size=4)
    prompt = prompts_of(engine.model_config.vocab_size, [30])[0]
    params = PoolingParams(method=method)
    first = run(engine, [prompt], params, with_generation=False)
    hits_before = engine.block_manager.num_cached_blocks
    second = run(engine, [prompt], params, with_generation=False)
    assert hits_before > 0
    assert second[0] == pytest.approx(first[0], abs=1e-5)


def test_dimensions_and_no_normalization(make_engine, hf_hidden) -> None:  # noqa: ANN001
    engine = make_engine()
    prompt = prompts_of(engine.model_config.vocab_size, [11])[0]
    for params in (PoolingParams(dimensions=8), PoolingParams(normalize=False)):
        (vector,) = run(engine, [prompt], params, with_generation=False)
        assert vector == pytest.approx(reference(hf_hidden(prompt), params), abs=1e-4)
    assert len(run(engine, [prompt], PoolingParams(dimensions=8), with_generation=False)[0]) == 8


def test_bad_requests_raise_before_scheduling(make_engine) -> None:  # noqa: ANN001
    engine = make_engine(max_model_len=32)
    with pytest.raises(InvalidRequestError, match="longer than the model's maximum context length"):
        engine.add_pooling_request(list(range(5, 38)), PoolingParams())
    assert len(engine.add_pooling_request(list(range(5, 37)), PoolingParams()).request_id) > 0  # exactly 32 fits
    with pytest.raises(InvalidRequestError) as info:
        engine.add_pooling_request([5, 6], PoolingParams(dimensions=10**6))
    assert info.value.param == "dimensions"
    with pytest.raises(InvalidRequestError):
        engine.add_pooling_request([], PoolingParams())


def test_abort_frees_the_blocks(make_engine) -> None:  # noqa: ANN001
    engine = make_engine(max_num_batched_tokens=8, block_size=4)
    handle = engine.add_pooling_request(list(range(5, 45)), PoolingParams(method="mean"))
    engine.step()  # the first chunk of 40 tokens
    assert engine.block_manager.num_free_blocks < engine.block_manager.num_blocks
    engine.abort(handle.request_id)
    engine.step()
    assert not engine.has_work()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
