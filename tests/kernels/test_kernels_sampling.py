"""Sampling: masks against a naive per-row implementation, reproducibility per row, the
distribution of picks, and identical picks from the Triton kernel (interpreted) and the reference."""

from __future__ import annotations

import pytest
import torch

from kernels.sampling import sample_reference, sample_triton, sampling_mask

IMPLS = [sample_reference, sample_triton]


def _knobs(batch: int, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    def lane(value, dtype):
        if isinstance(value, (list, tuple)):
            return torch.tensor(value, dtype=dtype)
        return torch.full((batch,), value, dtype=dtype)

    return (
        lane(temperature, torch.float32),
        lane(top_k, torch.int32),
        lane(top_p, torch.float32),
        lane(min_p, torch.float32),
    )


# One row per setting: (temperature, top_k, top_p, min_p)
SETTINGS = [
    (1.0, 0, 1.0, 0.0),
    (0.7, 20, 1.0, 0.0),
    (1.3, 0, 0.8, 0.0),
    (1.0, 0, 1.0, 0.2),
    (0.9, 50, 0.9, 0.05),
    (2.0, 3, 0.5, 0.0),
    (0.0, 5, 0.5, 0.5),  # greedy: knobs ignored
    (1.0, 1, 1.0, 0.0),
]


def _settings_batch(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    batch = len(SETTINGS)
    logits = torch.randn(batch, vocab, generator=g) * 3
    temperature, top_k, top_p, min_p = (list(col) for col in zip(*SETTINGS))
    knobs = _knobs(batch, temperature, top_k, top_p, min_p)
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=g)
    offsets = torch.randint(0, 2**40, (batch,), generator=g)
    return logits, knobs, seeds, offsets


def _naive_mask_row(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float
) -> set[int]:
    """The allowed set by the definitions, one row at a time, in float64 (distinct logits)."""
    if temperature <= 0:
        return {int(logits.argmax())}
    order = sorted(range(logits.numel()), key=lambda j: -float(logits[j]))
    if 0 < top_k < len(order):
        order = order[:top_k]
    probs = torch.softmax(logits.double()[order] / temperature, dim=0).tolist()
    if top_p < 1.0:
        kept, mass = [], 0.0
        for j, p in zip(order, probs):
            if kept and mass >= top_p:
                break
            kept.append(j)
            mass += p
        probs = probs[: len(kept)]
        order = kept
    return {j for j, p in zip(order, probs) if p >= min_p * probs[0]}


def test_sampling_mask_matches_the_definitions() -> None:
    logits, knobs, _, _ = _settings_batch(300, seed=1)
    mask = sampling_mask(logits, *knobs)
    for b, (temperature, top_k, top_p, min_p) in enumerate(SETTINGS):
        expected = _naive_mask_row(logits[b], temperature, top_k, top_p, min_p)
        assert set(mask[b].nonzero().flatten().tolist()) == expected, SETTINGS[b]


def test_top_k_keeps_ties_with_the_kth_logit() -> None:
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0]])
    mask = sampling_mask(logits, *_knobs(1, top_k=2))
    assert mask[0].tolist() == [True, False, True, True, False]


@pytest.mark.parametrize("impl", IMPLS)
def test_greedy_rows_are_argmax_with_first_index_on_ties(impl) -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 200, generator=g)
    logits[1, 10] = logits[1, 150] = 50.0  # tie: the first index wins
    logits[2, :] = float("-inf")
    logits[2, 77] = 0.0
    knobs = _knobs(4, temperature=[0.0, 0.0, 0.0, 1.0], top_k=7, top_p=0.3, min_p=0.1)
    out = impl(logits, *knobs, torch.arange(4), torch.zeros(4, dtype=torch.int64))
    assert out.dtype == torch.int64
    assert out[:3].tolist() == [int(logits[0].argmax()), 10, 77]


def test_reference_picks_stay_in_the_allowed_set_over_many_draws() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(1, 64, generator=g) * 2
    for temperature, top_k, top_p, min_p in SETTINGS:
        draws = 400
        knobs = _knobs(draws, temperature, top_k, top_p, min_p)
        picks = sample_reference(
            logits.expand(draws, -1), *knobs, torch.full((draws,), 7), torch.arange(draws)
        )
        allowed = sampling_mask(logits, *_knobs(1, temperature, top_k, top_p, min_p))[0]
        assert allowed[picks].all(), (temperature, top_k, top_p, min_p)
        if temperature > 0 and int(allowed.sum()) > 1:
            assert picks.unique().numel() > 1


def test_reference_pick_frequencies_follow_the_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    draws = 6000
    knobs = _knobs(draws, temperature=0.8, top_p=0.9)
    seeds, offsets = torch.full((draws,), 11), torch.arange(draws)
    picks = sample_reference(logits.expand(draws, -1), *knobs, seeds, offsets)
    allowed = sampling_mask(logits, *_knobs(1, temperature=0.8, top_p=0.9))[0]
    probs = torch.where(allowed, torch.softmax(logits[0] / 0.8, 0), 0.0)
    probs = probs / probs.sum()
    freq = torch.bincount(picks, minlength=6).double() / draws
    sigma = (probs * (1 - probs) / draws).sqrt()
    assert ((freq - probs).abs() <= 5 * sigma + 1e-9).all(), (freq, probs)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_row_pick_ignores_batch_position_and_mates(impl) -> None:
    logits, knobs, seeds, offsets = _settings_batch(257, seed=4)
    first = impl(logits, *knobs, seeds, offsets)
    g = torch.Generator().manual_seed(5)
    perm = torch.randperm(len(SETTINGS), generator=g)
    mates = torch.randn(3, 257, generator=g)
    mixed_logits = torch.cat([mates, logits[perm]])
    mate_knobs = _knobs(3, 1.0, 0, 1.0, 0.0)
    mixed_knobs = [torch.cat([m, k[perm]]) for m, k in zip(mate_knobs, knobs)]
    mixed_seeds = torch.cat([torch.tensor([1, 2, 3]), seeds[perm]])
    mixed_offsets = torch.cat([torch.tensor([4, 5, 6]), offsets[perm]])
    second = impl(mixed_logits, *mixed_knobs, mixed_seeds, mixed_offsets)
    assert torch.equal(second[3:], first[perm])


def test_the_seed_and_the_offset_both_change_the_pick() -> None:
    logits = torch.zeros(1, 1000).expand(64, -1)  # uniform: every draw is noise alone
    knobs = _knobs(64)
    base = sample_reference(logits, *knobs, torch.full((64,), 5), torch.arange(64))
    other_seed = sample_reference(logits, *knobs, torch.full((64,), 6), torch.arange(64))
    assert base.unique().numel() > 50
    assert (base != other_seed).sum() > 50


@pytest.mark.parametrize("vocab", [300, 1500])
def test_triton_picks_the_reference_tokens(vocab: int) -> None:
    logits, knobs, seeds, offsets = _settings_batch(vocab, seed=vocab)
    expected = sample_reference(logits, *knobs, seeds, offsets)
    out = sample_triton(logits, *knobs, seeds, offsets)
    assert out.tolist() == expected.tolist()
    assert sampling_mask(logits, *knobs)[torch.arange(len(SETTINGS)), out].all()


def test_triton_keeps_the_same_boundary_tokens() -> None:
    """Many draws where the last token each filter keeps, or the first it drops, would often be
    picked: a cut-off one token off in the kernel shows as a different pick."""
    rows = 8
    graded = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5])
    close = torch.tensor([2.0, 1.99, 1.98, 0.0, 0.0, -0.5, -1.0, -1.5])
    logits = torch.stack([graded] * rows + [close] * rows + [graded] * rows)
    # top-p 0.7 keeps graded 0-2 (mass above token 2 is 0.64, above token 3 0.79); top-k 2
    # keeps close 0-1 and drops the nearly equal token 2; min-p 0.3 keeps graded 0-2
    # (p2 / p0 = e**-1 = 0.37, p3 / p0 = 0.22)
    knobs = _knobs(3 * rows, top_k=[0] * rows + [2] * rows + [0] * rows,
                   top_p=[0.7] * rows + [1.0] * 2 * rows, min_p=[0.0] * 2 * rows + [0.3] * rows)
    seeds, offsets = torch.full((3 * rows,), 0), torch.arange(3 * rows)
    expected = sample_reference(logits, *knobs, seeds, offsets)
    assert sample_triton(logits, *knobs, seeds, offsets).tolist() == expected.tolist()
    picked = [set(expected[i * rows : (i + 1) * rows].tolist()) for i in range(3)]
    assert picked == [{0, 1, 2}, {0, 1}, {0, 1, 2}]


def test_triton_with_masked_out_logits_and_zero_signs() -> None:
    """-inf logits (structured output) are never picked; -0.0 and +0.0 count as equal."""
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(4, 400, generator=g)
    logits[:, ::3] = float("-inf")
    logits[3] = float("-inf")
    logits[3, 5], logits[3, 9], logits[3, 20] = -0.0, 0.0, -1.0
    knobs = _knobs(4, temperature=[1.0, 0.5, 1.0, 1.0], top_k=[0, 300, 10, 2], top_p=[0.95, 1.0, 0.9, 1.0])
    seeds, offsets = torch.tensor([9, 8, 7, 6]), torch.tensor([0, 1, 2, 3])
    expected = sample_reference(logits, *knobs, seeds, offsets)
    out = sample_triton(logits, *knobs, seeds, offsets)
    assert out.tolist() == expected.tolist()
    assert torch.isfinite(logits[torch.arange(4), out]).all()
    assert sampling_mask(logits, *knobs)[3].nonzero().flatten().tolist() == [5, 9]


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_arguments_are_named(impl) -> None:
    logits = torch.randn(2, 10)
    temperature, top_k, top_p, min_p = _knobs(2)
    seeds = offsets = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(TypeError, match="logits must be float32"):
        impl(logits.bfloat16(), temperature, top_k, top_p, min_p, seeds, offsets)
    with pytest.raises(TypeError, match="top_k must be int32"):
        impl(logits, temperature, top_k.long(), top_p, min_p, seeds, offsets)
    with pytest.raises(TypeError, match="seeds must be int64"):
        impl(logits, temperature, top_k, top_p, min_p, seeds.int(), offsets)
    with pytest.raises(ValueError, match="offsets.shape"):
        impl(logits, temperature, top_k, top_p, min_p, seeds, offsets[:1])
    with pytest.raises(ValueError, match="temperature must have 1 dims"):
        impl(logits, temperature[:, None], top_k, top_p, min_p, seeds, offsets)
