"""Paged attention for prefill: variable-length query chunks against cached K/V, causally.

The batch's new query tokens are flattened along T; sequence b's queries are
q[cu_seqlens_q[b] : cu_seqlens_q[b + 1]] and their K/V are already in the cache. seq_lens[b] is
the total context length including them, so query i of sequence b (q_len_b queries) sits at
position seq_lens[b] - q_len_b + i and attends to positions <= its own. That one rule covers a
plain prefill, a prefill after cached prefix blocks, and one chunk of a chunked prefill.

The Triton kernel runs one program per (tile of BLOCK_Q queries of one sequence, kv head); its
rows are those queries times the kv head's Hq // Hkv query heads, so each K/V tile is read once
per group. Tiles are numbered without knowing the longest chunk on the host: sequence b's tiles
start at cu_seqlens_q[b] // BLOCK_Q + b, a program finds its sequence by binary search, and
programs past the last tile of their sequence do nothing.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kernels import cpu_ext
from kernels._checks import check_same_device, check_size, check_tensor, check_unit_last_stride
from kernels._launch import launchable, next_power_of_2
from kernels.decode_attention import check_paged_kv, dot_config, gather_heads, softmax_times_v

try:
    import triton
    import triton.language as tl
except ImportError:
    from kernels._no_triton import tl, triton


@triton.jit
def _prefill_kernel(
    q_ptr,  # [T, Hq, D]
    k_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    v_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    block_tables_ptr,  # [B, max_blocks]
    cu_seqlens_q_ptr,  # [B + 1]
    seq_lens_ptr,  # [B]
    out_ptr,  # [T, Hq, D]
    scale_log2,  # softmax scale * log2(e)
    stride_qt,
    stride_qh,
    stride_cache_block,
    stride_cache_slot,
    stride_cache_head,
    stride_bt,
    stride_ot,
    stride_oh,
    num_seqs,
    num_queries_per_kv,
    head_dim,
    BLOCK_SIZE: tl.constexpr,  # cache block size
    BLOCK_Q: tl.constexpr,  # query tokens per program
    BLOCK_G: tl.constexpr,  # >= num_queries_per_kv; BLOCK_Q * BLOCK_G >= 16 for tl.dot
    BLOCK_D: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)

    # The sequence owning this tile: the last b with cu_seqlens_q[b] // BLOCK_Q + b <= tile.
    lo = tl.zeros([], dtype=tl.int32)  # a tensor, not a constexpr: it is loop-carried
    hi = lo + num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(cu_seqlens_q_ptr + mid) // BLOCK_Q + mid <= tile:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len  # positions before this sequence's first new query
    q_first = (tile - (q_start // BLOCK_Q + seq)) * BLOCK_Q  # tile's first query, within the seq

    r = tl.arange(0, BLOCK_Q * BLOCK_G)  # row = query token * BLOCK_G + head in the group
    d = tl.arange(0, BLOCK_D)
    q_idx = q_first + r // BLOCK_G  # [BLOCK_M]
    g = r % BLOCK_G
    row_mask = (q_idx < q_len) & (g < num_queries_per_kv)
    d_mask = d < head_dim
    q_pos = context_len + q_idx  # [BLOCK_M] absolute positions
    token = (q_start + q_idx).to(tl.int64)
    heads = kv_head * num_queries_per_kv + g
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=row_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(DOT_DTYPE)  # [BLOCK_M, BLOCK_D]

    # Positions up to the tile's last query; none when the tile lies past the sequence's queries.
    kv_end = tl.where(q_first < q_len, context_len + tl.minimum(q_first + BLOCK_Q, q_len), 0)
    m = tl.full([BLOCK_Q * BLOCK_G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_Q * BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_Q * BLOCK_G, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    head_offset = kv_head.to(tl.int64) * stride_cache_head
    for tile_start in range(0, kv_end, TILE_N):
        pos = tile_start + tl.arange(0, TILE_N)  # [TILE_N]
        pos_mask = pos < kv_end
        block = tl.load(table + pos // BLOCK_SIZE, mask=pos_mask, other=0).to(tl.int64)
        rows = block * stride_cache_block + (pos % BLOCK_SIZE) * stride_cache_slot + head_offset
        kv_mask = pos_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=DOT_PRECISION)
        visible = pos_mask[None, :] & (pos[None, :] <= q_pos[:, None])  # [BLOCK_M, TILE_N]
        scores = tl.where(visible, scores * scale_log2, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
        p = p.to(v_cache_ptr.dtype.element_ty).to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p, v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
        m = m_new

    out = acc / tl.where(l == 0.0, 1.0, l)[:, None]
    out_ptrs = out_ptr + token[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])


def _check_args(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    cu_seqlens_q: Tensor,
    seq_lens: Tensor,
    scale: float,
) -> None:
    check_paged_kv(q, k_cache, v_cache, block_tables, scale)
    check_tensor("cu_seqlens_q", cu_seqlens_q, ndim=1, dtypes=(torch.int32,))
    check_tensor("seq_lens", seq_lens, ndim=1, dtypes=(torch.int32,))
    num_seqs = block_tables.shape[0]
    check_size("seq_lens", seq_lens, 0, num_seqs, "block_tables.shape[0], the number of sequences")
    check_size("cu_seqlens_q", cu_seqlens_q, 0, num_seqs + 1, "number of sequences + 1")
    check_same_device(
        [("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables),
         ("cu_seqlens_q", cu_seqlens_q), ("seq_lens", seq_lens)]
    )


def paged_attention_prefill_reference(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    cu_seqlens_q: Tensor,
    seq_lens: Tensor,
    scale: float,
) -> Tensor:
    """q: [T, Hq, D]; caches: [num_blocks, block_size, Hkv, D]; block_tables: [B, max_blocks];
    cu_seqlens_q: [B + 1]; seq_lens: [B] -> [T, Hq, D] in q's dtype.

    Per sequence, float32 matmuls with a causal mask; the Hq // Hkv query heads of a kv head are
    stacked as rows of one matrix, so K/V are never expanded. Unlike the kernel it reads the
    lengths on the host, so it also checks them: ValueError if they disagree with q or with each
    other.
    """
    _check_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale)
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    group = num_q_heads // num_kv_heads
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    if cu[0] != 0 or cu[-1] != q.shape[0]:
        raise ValueError(f"cu_seqlens_q must run from 0 to q.shape[0]={q.shape[0]}, got {cu}")
    out = torch.empty_like(q)  # [T, Hq, D]
    for b, seq_len in enumerate(lens):
        q_len = cu[b + 1] - cu[b]
        if not 0 <= q_len <= seq_len:
            raise ValueError(
                f"sequence {b}: {q_len} queries (cu_seqlens_q) but seq_lens[{b}]={seq_len}"
            )
        if q_len == 0:
            continue
        num_blocks = -(-seq_len // block_size)
        if num_blocks > block_tables.shape[1]:
            raise ValueError(
                f"sequence {b}: seq_lens[{b}]={seq_len} needs {num_blocks} blocks, "
                f"block_tables has {block_tables.shape[1]} columns"
            )
        block_ids = block_tables[b, :num_blocks].long()  # [nb]
        k, v = gather_heads(k_cache, v_cache, block_ids)
        k, v = k[:, :seq_len], v[:, :seq_len]  # [Hkv, S, D] each
        # the G query heads of a kv head, all positions, as the rows of one matrix: [Hkv, G * q_len, D]
        qb = q[cu[b] : cu[b + 1]].float().reshape(q_len, num_kv_heads, group, head_dim)
        qb = qb.permute(1, 2, 0, 3).reshape(num_kv_heads, group * q_len, head_dim)
        scores = torch.bmm(qb, k.transpose(1, 2)).mul_(scale)  # [Hkv, G * q_len, S]
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)  # [q_len]
        future = torch.arange(seq_len, device=q.device)[None, :] > q_pos[:, None]  # [q_len, S]
        scores.view(num_kv_heads, group, q_len, seq_len).masked_fill_(future, float("-inf"))
        ob = softmax_times_v(scores, v, q.dtype)  # [Hkv, G * q_len, D]
        out[cu[b] : cu[b + 1]] = ob.view(num_kv_heads, group, q_len, head_dim).permute(2, 0, 1, 3).reshape(
            q_len, num_q_heads, head_dim
        )
    return out


def paged_attention_prefill_cpu(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    cu_seqlens_q: Tensor,
    seq_lens: Tensor,
    scale: float,
) -> Tensor:
    """The hand-written CPU kernel (kernels/csrc/cpu_kernels.cpp); same contract as
    paged_attention_prefill_reference, reading K/V in place. A query's arithmetic is the decode
    kernel's, so a token gets the same output bit for bit whether it is prefilled or decoded.
    RuntimeError when the library is not built (see kernels/cpu_ext.py)."""
    _check_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale)
    for name, tensor in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables)):
        check_unit_last_stride(name, tensor)
    return cpu_ext.require_ops().paged_attention_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q.contiguous(),
                                                         seq_lens.contiguous(), scale)


def paged_attention_prefill_triton(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    cu_seqlens_q: Tensor,
    seq_lens: Tensor,
    scale: float,
    *,
    block_m: int = 64,
    tile_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
) -> Tensor:
    """Triton paged prefill attention; same contract as paged_attention_prefill_reference.

    Lengths are not read on the host (no device sync): cu_seqlens_q must run from 0 to
    q.shape[0] without decreasing and 0 <= q_len_b <= seq_lens[b] for every sequence b.
    block_m (rows per program = queries x group heads) and tile_n are tuning knobs.
    """
    _check_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale)
    for name, tensor in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_unit_last_stride(name, tensor)
    if v_cache.stride() != k_cache.stride():
        raise ValueError(
            f"v_cache must have k_cache's strides {k_cache.stride()}, got {v_cache.stride()}"
        )
    check_unit_last_stride("block_tables", block_tables)
    num_tokens, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_seqs = block_tables.shape[0]
    out = torch.empty((num_tokens, num_q_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0 or num_seqs == 0:
        return out
    kernel = launchable(_prefill_kernel, q.device)
    dot_dtype, dot_precision = dot_config(q)
    num_queries_per_kv = num_q_heads // num_kv_heads
    block_g = next_power_of_2(num_queries_per_kv)
    block_q = max(block_m // block_g, 1, 16 // block_g)
    kernel[(num_tokens // block_q + num_seqs, num_kv_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        seq_lens,
        out,
        scale * math.log2(math.e),
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        num_seqs,
        num_queries_per_kv,
        head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_Q=block_q,
        BLOCK_G=block_g,
        BLOCK_D=max(next_power_of_2(head_dim), 16),
        TILE_N=tile_n,
        DOT_DTYPE=dot_dtype,
        DOT_PRECISION=dot_precision,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out
