"""Paged prefill attention: Triton (interpreted) against the torch reference, and the reference
against a naive float64 attention over the gathered cache."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close, dense_kv, make_paged_kv, naive_attention

from kernels.prefill_attention import (
    paged_attention_prefill_reference,
    paged_attention_prefill_triton,
)

BLOCK_SIZE = 16
NUM_KV_HEADS = 2
# (seq_len, q_len): whole prompts of edge lengths, a prompt after 2 cached prefix blocks, a
# middle chunk of a chunked prefill (context not block-aligned), a one-token chunk after 300.
MIXED = [(1, 1), (15, 15), (16, 16), (17, 17), (40, 8), (100, 30), (300, 1)]
LONG = [(230, 230), (33, 20)]


def _case(head_dim, group, dtype, lens=MIXED, block_size=BLOCK_SIZE, shared_prefix_blocks=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    seq_lens = [s for s, _ in lens]
    q_lens = [n for _, n in lens]
    k_cache, v_cache, tables = make_paged_kv(
        seq_lens, block_size=block_size, num_kv_heads=NUM_KV_HEADS, head_dim=head_dim,
        dtype=dtype, generator=g, shared_prefix_blocks=shared_prefix_blocks,
    )
    q = torch.randn(sum(q_lens), NUM_KV_HEADS * group, head_dim, generator=g).to(dtype)
    cu = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    return q, k_cache, v_cache, tables, cu, torch.tensor(seq_lens, dtype=torch.int32), head_dim**-0.5


def _check_triton(args, **knobs) -> None:
    expected = paged_attention_prefill_reference(*args)
    out = paged_attention_prefill_triton(*args, **knobs)
    assert_close(out, expected, "attention")


@pytest.mark.parametrize("group", [1, 4])
def test_reference_matches_naive_attention(group: int) -> None:
    lens = [(1, 1), (17, 17), (40, 8), (70, 30)]
    q, k_cache, v_cache, tables, cu, seq_lens, scale = _case(32, group, torch.float32, lens=lens)
    out = paged_attention_prefill_reference(q, k_cache, v_cache, tables, cu, seq_lens, scale)
    for b, (seq_len, q_len) in enumerate(lens):
        k, v = dense_kv(k_cache, tables[b], seq_len), dense_kv(v_cache, tables[b], seq_len)
        rows = slice(int(cu[b]), int(cu[b + 1]))
        positions = torch.arange(seq_len - q_len, seq_len)
        expected = naive_attention(q[rows], k, v, positions, scale)
        torch.testing.assert_close(out[rows].double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_matches_reference(head_dim: int, group: int, dtype: torch.dtype) -> None:
    _check_triton(_case(head_dim, group, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_prompts(dtype: torch.dtype) -> None:
    _check_triton(_case(64, 4, dtype, lens=LONG, seed=1))


def test_shared_prefix_blocks() -> None:
    """Prefix caching: both sequences' first 2 blocks are the same physical blocks."""
    lens = [(40, 8), (45, 13)]
    _check_triton(_case(32, 4, torch.float32, lens=lens, shared_prefix_blocks=2, seed=2))


def test_small_tiles_and_large_blocks() -> None:
    lens = [(31, 31), (70, 6), (33, 33)]
    args = _case(64, 2, torch.float32, lens=lens, block_size=32, seed=3)
    _check_triton(args, block_m=16, tile_n=16)


@pytest.mark.parametrize("impl", [paged_attention_prefill_reference, paged_attention_prefill_triton])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_major_cache_storage(impl, dtype: torch.dtype) -> None:
    """The engine's layout: the cache a view of [Hkv, num_blocks, block_size, D] storage."""
    q, k_cache, v_cache, tables, cu, seq_lens, scale = _case(32, 4, dtype, seed=4)
    expected = paged_attention_prefill_reference(q, k_cache, v_cache, tables, cu, seq_lens, scale)
    k_hm, v_hm = (c.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3) for c in (k_cache, v_cache))
    assert_close(impl(q, k_hm, v_hm, tables, cu, seq_lens, scale), expected, "attention")


@pytest.mark.parametrize("impl", [paged_attention_prefill_triton, paged_attention_prefill_reference])
def test_bad_arguments_are_named(impl) -> None:
    q, k_cache, v_cache, tables, cu, seq_lens, scale = _case(32, 2, torch.float32, lens=[(5, 3), (9, 9)])
    with pytest.raises(TypeError, match="cu_seqlens_q must be int32"):
        impl(q, k_cache, v_cache, tables, cu.long(), seq_lens, scale)
    with pytest.raises(ValueError, match="cu_seqlens_q.shape"):
        impl(q, k_cache, v_cache, tables, cu[:2], seq_lens, scale)
    with pytest.raises(ValueError, match="seq_lens.shape"):
        impl(q, k_cache, v_cache, tables, cu, seq_lens[:1], scale)
    with pytest.raises(ValueError, match="q must have 3 dims"):
        impl(q[0], k_cache, v_cache, tables, cu, seq_lens, scale)


def test_reference_checks_lengths() -> None:
    q, k_cache, v_cache, tables, cu, seq_lens, scale = _case(32, 2, torch.float32, lens=[(5, 3), (9, 9)])
    with pytest.raises(ValueError, match="cu_seqlens_q must run from 0"):
        paged_attention_prefill_reference(q[:-1], k_cache, v_cache, tables, cu, seq_lens, scale)
    with pytest.raises(ValueError, match="sequence 1: 9 queries"):
        paged_attention_prefill_reference(
            q, k_cache, v_cache, tables, cu, torch.tensor([5, 8], dtype=torch.int32), scale
        )
