"""Shared helpers for the kernel tests: tolerances, paged-cache builders, naive attention."""

from __future__ import annotations

import torch
from torch import Tensor

# (rtol, atol) by dtype and kind. bfloat16: the interpreter rounds float32 -> bfloat16 by
# truncation where torch rounds to nearest, so results may differ by 1 ulp (2**-7 relative) at
# each rounding point: up to 4 ulps where an op rounds twice as transformers does (norm, rotary);
# attention additionally rounds softmax weights to bfloat16 before the PV product.
TOLERANCES = {
    (torch.float32, "elementwise"): (1e-5, 1e-5),
    (torch.bfloat16, "elementwise"): (3.2e-2, 1e-5),
    # a difference of two rounded products (rotary) may cancel to ~0 on one side only: an ulp of the
    # products (inputs ~ N(0, 1) here) in absolute terms
    (torch.float32, "cancelling"): (1e-5, 1e-5),
    (torch.bfloat16, "cancelling"): (3.2e-2, 3.2e-2),
    (torch.float32, "attention"): (1e-4, 1e-5),
    (torch.bfloat16, "attention"): (2e-2, 2e-2),
}


def assert_close(actual: Tensor, expected: Tensor, kind: str = "elementwise") -> None:
    """Compare with the tolerance for expected's dtype and `kind`; dtypes must match."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    rtol, atol = TOLERANCES[(expected.dtype, kind)]
    torch.testing.assert_close(actual.float(), expected.float(), rtol=rtol, atol=atol)


def make_paged_kv(
    seq_lens: list[int],
    *,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    generator: torch.Generator,
    spare_blocks: int = 3,
    shared_prefix_blocks: int = 0,
) -> tuple[Tensor, Tensor, Tensor]:
    """Random caches and shuffled, non-monotonic block tables for sequences of `seq_lens`.

    Returns k_cache, v_cache: [num_blocks, block_size, Hkv, D] and block_tables: [B, max_blocks]
    int32, padded with an out-of-range block id that a kernel must never read. With
    shared_prefix_blocks, every sequence's first blocks are the same physical blocks (prefix
    caching).
    """
    blocks_needed = [-(-n // block_size) for n in seq_lens]
    own = [max(n - shared_prefix_blocks, 0) for n in blocks_needed]
    num_blocks = shared_prefix_blocks + sum(own) + spare_blocks
    perm = torch.randperm(num_blocks, generator=generator)
    shared, rest = perm[:shared_prefix_blocks], perm[shared_prefix_blocks:]
    max_blocks = max(blocks_needed) + 2
    junk = num_blocks + 1000
    tables = torch.full((len(seq_lens), max_blocks), junk, dtype=torch.int32)
    start = 0
    for b, n in enumerate(blocks_needed):
        ids = torch.cat([shared, rest[start : start + own[b]]])[:n]
        tables[b, :n] = ids.to(torch.int32)
        start += own[b]
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=generator).to(dtype)
    v_cache = torch.randn(shape, generator=generator).to(dtype)
    return k_cache, v_cache, tables


def dense_kv(cache: Tensor, table_row: Tensor, length: int) -> Tensor:
    """[length, Hkv, D]: one sequence's cached positions 0..length-1, gathered by a loop."""
    block_size = cache.shape[1]
    rows = [cache[int(table_row[p // block_size]), p % block_size] for p in range(length)]
    return torch.stack(rows)


def naive_attention(q: Tensor, k: Tensor, v: Tensor, q_positions: Tensor, scale: float) -> Tensor:
    """q: [n, Hq, D] at q_positions [n]; k, v: [S, Hkv, D] -> [n, Hq, D] float64.

    Explicit float64 softmax, kv heads repeated for GQA, position p visible to a query at
    position >= p: an independent check of the references.
    """
    group = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(group, dim=1)  # [S, Hq, D]
    v64 = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,shd->hns", q.double(), k64) * scale  # [Hq, n, S]
    visible = torch.arange(k.shape[0])[None, :] <= q_positions[:, None]  # [n, S]
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hns,shd->nhd", scores.softmax(dim=-1), v64)
