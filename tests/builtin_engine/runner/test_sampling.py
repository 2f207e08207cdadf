"""Sampler and output properties: seeds reproducible regardless of batch mates, truncation never
leaves the allowed set, penalties, logit_bias, logprobs, stop strings across tokens, min_tokens,
max_tokens, stop_token_ids, n > 1."""

from __future__ import annotations

import math
import random

import pytest
import torch

import kernels
from builtin_engine.output_processor import ChoiceState
from builtin_engine.runner.sampler import Sampler, prepare_sampling_metadata
from builtin_engine.scheduling.sampling_params import SamplingParams
from builtin_engine.scheduling.sequence import Sequence
from tests.builtin_engine.conftest import collect


def run_one(engine, prompt: list[int], params: SamplingParams, *, mates: list[tuple[list[int], SamplingParams]] = (),
            mates_every: int = 1):  # noqa: ANN001
    """Run `prompt` by hand-stepping the engine while batch mates join one per `mates_every` steps."""
    handle = engine.add_request(prompt, params)
    pending, step = list(mates), 0
    while pending or engine.has_work():
        if pending and step % mates_every == 0:
            engine.add_request(*pending.pop(0))
        engine.step()
        step += 1
    return collect(handle)


def random_prompt(rng: random.Random, n: int, vocab: int = 1000) -> list[int]:
    return [rng.randrange(5, vocab) for _ in range(n)]


# ---- seeds ------------------------------------------------------------------------------------


def test_seed_reproducible_regardless_of_batch_mates(make_engine) -> None:  # noqa: ANN001
    rng = random.Random(0)
    prompt = random_prompt(rng, 20)
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=42, max_tokens=16)
    alone, _, _ = run_one(make_engine(max_num_batched_tokens=64), prompt, params)
    mates = [(random_prompt(rng, n), SamplingParams(temperature=1.3, max_tokens=10)) for n in (5, 50, 13, 2)]
    batched, _, _ = run_one(make_engine(max_num_batched_tokens=16), prompt, params, mates=mates)
    assert batched[0] == alone[0]
    # tight KV cache: preemption and recompute keep the same tokens
    crowded, _, _ = run_one(make_engine(max_num_batched_tokens=16, block_size=4, kv_cache_tokens=64,
                                        max_model_len=64), prompt, params, mates=mates)
    assert crowded[0] == alone[0]
    other_seed, _, _ = run_one(make_engine(), prompt, SamplingParams(temperature=1.0, top_p=0.95, seed=43,
                                                                     max_tokens=16))
    assert other_seed[0] != alone[0]


def test_top_k_one_is_greedy(make_engine, hf_tiny) -> None:  # noqa: ANN001
    prompt = random_prompt(random.Random(3), 12)
    tokens, _, _ = run_one(make_engine(), prompt, SamplingParams(temperature=1.5, top_k=1, max_tokens=8))
    assert tokens[0] == hf_tiny.greedy(prompt, 8)


# ---- the sampler on synthetic logits ----------------------------------------------------------


def make_seq(params: SamplingParams, *, prompt: tuple[int, ...] = (1, 2, 3), output: tuple[int, ...] = (),
             seed: int = 0) -> Sequence:
    seq = Sequence(seq_id=0, request_id="r", index=0, prompt_ids=list(prompt), params=params, priority=0,
                   arrival=0, seed=seed, max_tokens=100)
    for token in output:
        seq.append_token(token)
    return seq


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=0.7, top_p=0.3),
        SamplingParams(temperature=1.2, min_p=0.2),
        SamplingParams(temperature=2.0, top_k=20, top_p=0.5, min_p=0.05),
    ],
    ids=["top_k", "top_p", "min_p", "all"],
)
def test_truncation_never_picks_outside_allowed_set(params: SamplingParams) -> None:
    torch.manual_seed(0)
    vocab, rows = 64, 200
    logits = torch.randn(rows, vocab) * 3
    seqs = [make_seq(params, seed=i) for i in range(rows)]
    meta = prepare_sampling_metadata(seqs, device=torch.device("cpu"))
    allowed = kernels.sampling_mask(logits, meta.temperature, meta.top_k, meta.top_p, meta.min_p)
    picked = Sampler(eos_token_ids=frozenset())(logits.clone(), meta).token_ids
    assert all(allowed[i, t] for i, t in enumerate(picked))
    assert len(set(picked)) > 1  # it does sample
    if params.top_k:
        assert int(allowed.sum(-1).max()) <= params.top_k


def test_penalties_and_logit_bias() -> None:
    vocab = 10
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5, 0.0, 3.0, -1.0, 0.0, 0.0, 0.0]])
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25,
                            logit_bias={9: 10.0})
    seq = make_seq(params, prompt=[0, 1], output=[2, 2, 5])
    meta = prepare_sampling_metadata([seq], device=torch.device("cpu"))
    processed = logits.clone()
    Sampler(eos_token_ids=frozenset())._process_row(processed[0], seq)
    expected = logits[0].clone()
    expected[9] += 10.0
    for t in (0, 1, 2, 5):  # repetition: prompt and output tokens
        expected[t] = expected[t] / 2 if expected[t] > 0 else expected[t] * 2
    expected[2] -= 0.25 * 2 + 0.5
    expected[5] -= 0.25 * 1 + 0.5
    assert torch.allclose(processed[0], expected)
    assert Sampler(eos_token_ids=frozenset())(logits.clone(), meta).token_ids == [9]
    assert vocab == logits.shape[1]


def test_min_tokens_bans_eos_and_stop_token_ids() -> None:
    logits = torch.zeros(1, 8)
    logits[0, 3] = 5.0  # the eos
    logits[0, 4] = 4.0  # a stop token id
    params = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=(4,))
    sampler = Sampler(eos_token_ids=frozenset({3}))
    early = make_seq(params, output=[1])
    assert sampler(logits.clone(), prepare_sampling_metadata([early], device=torch.device("cpu"))).token_ids == [0]
    late = make_seq(params, output=[1, 1])
    assert sampler(logits.clone(), prepare_sampling_metadata([late], device=torch.device("cpu"))).token_ids == [3]


def test_logprobs_raw_match_model_distribution(make_engine, hf_tiny) -> None:  # noqa: ANN001
    prompt = random_prompt(random.Random(5), 9)
    params = SamplingParams(temperature=0.8, seed=1, max_tokens=3, logprobs=True, top_logprobs=4,
                            repetition_penalty=1.5)
    engine = make_engine()
    handle = engine.add_request(prompt, params)
    engine.run_until_done()
    tokens, _, outs = collect(handle)
    logprobs = [lp for out in outs for c in out.choices for lp in c.logprobs]
    assert [lp.token_id for lp in logprobs] == tokens[0]
    with torch.inference_mode():
        hf_logits = hf_tiny.model(torch.tensor([prompt + tokens[0]])).logits[0].float()
    for i, lp in enumerate(logprobs):
        ref = torch.log_softmax(hf_logits[len(prompt) - 1 + i], -1)
        assert math.isclose(lp.logprob, float(ref[lp.token_id]), abs_tol=1e-4)  # raw: before penalty/temperature
        assert len(lp.top) == 4 and [t for t, _ in lp.top] == ref.topk(4).indices.tolist()
        assert all(a >= b for (_, a), (_, b) in zip(lp.top, lp.top[1:]))


# ---- stop strings (unit) ----------------------------------------------------------------------


class CharDetokenizer:
    """Token id -> fixed text piece; ids >= 100 are 'special' and give nothing."""

    def __init__(self, pieces: dict[int, str]) -> None:
        self.pieces = pieces

    def push(self, token_id: int) -> str:
        return self.pieces.get(token_id, "")

    def flush(self) -> str:
        return ""


PIECES = {1: "Hel", 2: "lo", 3: " wo", 4: "rld", 5: "!", 6: " ", 7: "x"}


def feed(params: SamplingParams, tokens: list[int], *, eos: frozenset[int] = frozenset({100})) -> list:
    seq = make_seq(params)
    seq.max_tokens = params.max_tokens or 100
    state = ChoiceState(seq, detokenizer=CharDetokenizer(PIECES), eos_token_ids=eos)
    outs = []
    for token in tokens:
        seq.append_token(token)
        outs.append(state.on_token(token, None))
        if outs[-1].finish_reason:
            break
    return outs


def test_stop_string_across_tokens_is_held_back_and_cut() -> None:
    outs = feed(SamplingParams(stop=("lo wor",)), [1, 2, 3, 4, 5])
    # "l", then "lo", "lo wo" are held back as possible starts of the stop string
    assert [o.text for o in outs] == ["He", "l", "", ""]
    assert outs[-1].finish_reason == "stop" and outs[-1].stop_reason == "lo wor"
    assert "".join(o.text for o in outs) == "Hel"


def test_stop_string_included_on_request() -> None:
    outs = feed(SamplingParams(stop=("lo wor",), include_stop_str_in_output=True), [1, 2, 3, 4, 5])
    assert "".join(o.text for o in outs) == "Hello wor"


def test_held_back_text_released_when_it_cannot_be_a_stop() -> None:
    outs = feed(SamplingParams(stop=("lo!",)), [1, 2, 3, 4])
    assert [o.text for o in outs] == ["He", "l", "lo wo", "rld"]
    assert outs[-1].finish_reason is None


def test_held_back_text_released_at_length() -> None:
    outs = feed(SamplingParams(stop=("lo!",), max_tokens=2), [1, 2])
    assert [o.text for o in outs] == ["He", "llo"] and outs[-1].finish_reason == "length"


def test_stop_strings_ignored_before_min_tokens() -> None:
    outs = feed(SamplingParams(stop=("x",), min_tokens=3), [7, 7, 7, 7])
    assert "".join(o.text for o in outs) == "xx" and outs[-1].finish_reason == "stop"
    assert len(outs) == 3


def test_eos_and_stop_token_text_not_in_output() -> None:
    outs = feed(SamplingParams(stop_token_ids=(5,)), [1, 2, 5])
    assert "".join(o.text for o in outs) == "Hello" and outs[-1].stop_reason == 5
    outs = feed(SamplingParams(stop_token_ids=(5,), include_stop_str_in_output=True), [1, 2, 5])
    assert "".join(o.text for o in outs) == "Hello!"
    outs = feed(SamplingParams(), [1, 100, 2])
    assert len(outs) == 2 and outs[-1].finish_reason == "stop" and outs[-1].stop_reason is None
    outs = feed(SamplingParams(ignore_eos=True, max_tokens=3), [1, 100, 2])
    assert len(outs) == 3 and outs[-1].finish_reason == "length"


# ---- stop strings, min/max tokens, n > 1 through the engine -----------------------------------


def test_stop_string_on_real_detokenized_text(make_engine) -> None:  # noqa: ANN001
    prompt = random_prompt(random.Random(7), 10)
    greedy = SamplingParams(temperature=0.0, max_tokens=20)
    _, texts, _ = run_one(make_engine(), prompt, greedy)
    full = texts[0]
    assert len(full) > 12
    stop = full[5:9]
    cut = full.index(stop)
    _, texts, outs = run_one(make_engine(), prompt, SamplingParams(temperature=0.0, max_tokens=20, stop=(stop,)))
    assert texts[0] == full[:cut]
    assert outs[-1].choices[-1].finish_reason == "stop" and outs[-1].choices[-1].stop_reason == stop
    _, texts, _ = run_one(make_engine(), prompt, SamplingParams(temperature=0.0, max_tokens=20, stop=(stop,),
                                                                include_stop_str_in_output=True))
    assert texts[0] == full[: cut + len(stop)]


def test_min_tokens_max_tokens_and_stop_token_ids(make_engine, tiny_tokenizer) -> None:  # noqa: ANN001
    engine = make_engine()
    eos = min(engine.eos_token_ids)
    prompt = random_prompt(random.Random(8), 6)
    forced_eos = SamplingParams(temperature=0.0, max_tokens=20, min_tokens=5, logit_bias={eos: 100.0})
    tokens, _, outs = run_one(engine, prompt, forced_eos)
    assert len(tokens[0]) == 6 and tokens[0][-1] == eos and eos not in tokens[0][:5]
    assert outs[-1].choices[-1].finish_reason == "stop" and outs[-1].num_output_tokens == 6
    tokens, _, outs = run_one(engine, prompt, SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True,
                                                             logit_bias={eos: 100.0}))
    assert tokens[0] == [eos] * 7 and outs[-1].choices[-1].finish_reason == "length"
    tokens, _, outs = run_one(engine, prompt, SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=(77,),
                                                             logit_bias={77: 100.0}))
    assert tokens[0] == [77] and outs[-1].choices[-1].stop_reason == 77
    assert tiny_tokenizer.vocab_size == engine.model_config.vocab_size


def test_n_choices_share_prefix_and_derive_seeds(make_engine) -> None:  # noqa: ANN001
    prompt = random_prompt(random.Random(9), 40)
    engine = make_engine(block_size=8)
    params = SamplingParams(n=3, temperature=1.5, seed=11, max_tokens=10, ignore_eos=True)
    tokens, _, outs = run_one(engine, prompt, params)
    assert sorted(tokens) == [0, 1, 2] and all(len(t) == 10 for t in tokens.values())
    assert len({tuple(t) for t in tokens.values()}) == 3  # distinct choices
    assert outs[-1].num_output_tokens == 30
    assert [sum(1 for o in outs for c in o.choices if c.finish_reason and c.index == i) for i in range(3)] == [1] * 3
    single, _, _ = run_one(make_engine(block_size=8), prompt, SamplingParams(temperature=1.5, seed=11, max_tokens=10,
                                                                           ignore_eos=True))
    assert single[0] == tokens[0]  # choice 0 keeps the request's seed
    again, _, _ = run_one(make_engine(block_size=8), prompt, params)
    assert again == tokens


def test_n_choices_followers_reuse_the_leaders_prompt_blocks(make_engine) -> None:  # noqa: ANN001
    engine = make_engine(block_size=8)
    prompt = random_prompt(random.Random(10), 40)
    handle = engine.add_request(prompt, SamplingParams(n=2, temperature=0.0, max_tokens=4, ignore_eos=True))
    engine.step()  # the leader prefills alone
    assert engine.last_step.num_prefill_seqs == 1 and engine.last_step.num_prefill_tokens == 40
    engine.step()  # the follower finds 39 // 8 * 8 = 32 prompt tokens cached
    assert engine.last_step.num_prefill_tokens == 8
    engine.run_until_done()
    tokens, _, _ = collect(handle)
    assert tokens[0] == tokens[1]  # greedy: identical choices
