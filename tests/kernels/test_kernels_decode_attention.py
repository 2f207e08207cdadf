"""Paged decode attention: Triton (interpreted) against the torch reference, and the reference
against a naive float64 attention over the gathered cache."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close, dense_kv, make_paged_kv, naive_attention

from kernels.decode_attention import (
    paged_attention_decode_reference,
    paged_attention_decode_triton,
)

BLOCK_SIZE = 16
SEQ_LENS = [1, BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1, 300]
NUM_KV_HEADS = 2


def _case(head_dim: int, group: int, dtype: torch.dtype, seq_lens=SEQ_LENS, block_size=BLOCK_SIZE, seed=0):
    g = torch.Generator().manual_seed(seed)
    k_cache, v_cache, tables = make_paged_kv(
        seq_lens, block_size=block_size, num_kv_heads=NUM_KV_HEADS, head_dim=head_dim,
        dtype=dtype, generator=g,
    )
    q = torch.randn(len(seq_lens), NUM_KV_HEADS * group, head_dim, generator=g).to(dtype)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    return q, k_cache, v_cache, tables, seq_lens_t, head_dim**-0.5


@pytest.mark.parametrize("group", [1, 4])
def test_reference_matches_naive_attention(group: int) -> None:
    q, k_cache, v_cache, tables, seq_lens, scale = _case(32, group, torch.float32)
    out = paged_attention_decode_reference(q, k_cache, v_cache, tables, seq_lens, scale)
    for b, n in enumerate(seq_lens.tolist()):
        k, v = dense_kv(k_cache, tables[b], n), dense_kv(v_cache, tables[b], n)
        expected = naive_attention(q[b : b + 1], k, v, torch.tensor([n - 1]), scale)
        torch.testing.assert_close(out[b : b + 1].double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_matches_reference(head_dim: int, group: int, dtype: torch.dtype) -> None:
    q, k_cache, v_cache, tables, seq_lens, scale = _case(head_dim, group, dtype)
    expected = paged_attention_decode_reference(q, k_cache, v_cache, tables, seq_lens, scale)
    out = paged_attention_decode_triton(q, k_cache, v_cache, tables, seq_lens, scale)
    assert_close(out, expected, "attention")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [2, 5])
def test_split_context_merge(num_splits: int, dtype: torch.dtype) -> None:
    """Flash-decoding path: the context split across programs, merged by a second kernel;
    with 5 splits of the 21-block table several splits lie past the shorter sequences."""
    q, k_cache, v_cache, tables, seq_lens, scale = _case(64, 4, dtype, seed=1)
    expected = paged_attention_decode_reference(q, k_cache, v_cache, tables, seq_lens, scale)
    out = paged_attention_decode_triton(
        q, k_cache, v_cache, tables, seq_lens, scale, num_splits=num_splits, tile_n=32
    )
    assert_close(out, expected, "attention")


def test_blocks_larger_than_tiles() -> None:
    q, k_cache, v_cache, tables, seq_lens, scale = _case(
        64, 2, torch.float32, seq_lens=[1, 31, 32, 33, 100], block_size=32, seed=2
    )
    expected = paged_attention_decode_reference(q, k_cache, v_cache, tables, seq_lens, scale)
    out = paged_attention_decode_triton(q, k_cache, v_cache, tables, seq_lens, scale, tile_n=16)
    assert_close(out, expected, "attention")


def test_strided_query() -> None:
    q, k_cache, v_cache, tables, seq_lens, scale = _case(32, 4, torch.float32, seed=3)
    wide = torch.randn(q.shape[0], q.shape[1] + 3, q.shape[2])
    wide[:, : q.shape[1]] = q
    q_view = wide[:, : q.shape[1]]
    expected = paged_attention_decode_reference(q, k_cache, v_cache, tables, seq_lens, scale)
    out = paged_attention_decode_triton(q_view, k_cache, v_cache, tables, seq_lens, scale)
    assert_close(out, expected, "attention")


def head_major(cache: torch.Tensor) -> torch.Tensor:
    """The same cache as a view of head-major storage, the layout the engine allocates."""
    return cache.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)


@pytest.mark.parametrize("impl", [paged_attention_decode_reference, paged_attention_decode_triton])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_major_cache_storage(impl, dtype: torch.dtype) -> None:
    q, k_cache, v_cache, tables, seq_lens, scale = _case(32, 4, dtype, seed=4)
    expected = paged_attention_decode_reference(q, k_cache, v_cache, tables, seq_lens, scale)
    out = impl(q, head_major(k_cache), head_major(v_cache), tables, seq_lens, scale)
    assert_close(out, expected, "attention")


@pytest.mark.parametrize("gather_bytes", [1, 1_000_000])
def test_reference_in_groups_of_sequences(monkeypatch, gather_bytes: int) -> None:
    """A small gather budget splits the batch (one sequence per group, or a few): same result."""
    from kernels import decode_attention

    q, k_cache, v_cache, tables, seq_lens, scale = _case(64, 4, torch.float32, seed=5)
    whole = paged_attention_decode_reference(q, k_cache, v_cache, tables, seq_lens, scale)
    monkeypatch.setattr(decode_attention, "GATHER_BYTES", gather_bytes)
    grouped = paged_attention_decode_reference(q, k_cache, v_cache, tables, seq_lens, scale)
    torch.testing.assert_close(grouped, whole, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("impl", [paged_attention_decode_triton, paged_attention_decode_reference])
def test_bad_arguments_are_named(impl) -> None:
    q, k_cache, v_cache, tables, seq_lens, scale = _case(32, 2, torch.float32, seq_lens=[3, 5])
    with pytest.raises(TypeError, match="block_tables must be int32"):
        impl(q, k_cache, v_cache, tables.long(), seq_lens, scale)
    with pytest.raises(TypeError, match="seq_lens must be int32"):
        impl(q, k_cache, v_cache, tables, seq_lens.long(), scale)
    with pytest.raises(ValueError, match="seq_lens.shape"):
        impl(q, k_cache, v_cache, tables, seq_lens[:1], scale)
    with pytest.raises(ValueError, match="block_tables.shape"):
        impl(q, k_cache, v_cache, tables[:1], seq_lens, scale)
    with pytest.raises(ValueError, match="must be a multiple of k_cache.shape\\[2\\]"):
        impl(q[:, :3], k_cache, v_cache, tables, seq_lens, scale)
    with pytest.raises(ValueError, match="k_cache.shape\\[3\\]"):
        impl(q[..., :16], k_cache, v_cache, tables, seq_lens, scale)
    with pytest.raises(TypeError, match="k_cache is torch.bfloat16 but q is torch.float32"):
        impl(q, k_cache.bfloat16(), v_cache.bfloat16(), tables, seq_lens, scale)
    with pytest.raises(ValueError, match="v_cache must have k_cache's shape"):
        impl(q, k_cache, v_cache[:1], tables, seq_lens, scale)
    with pytest.raises(ValueError, match="scale must be > 0"):
        impl(q, k_cache, v_cache, tables, seq_lens, 0.0)
