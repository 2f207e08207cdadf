"""Paged attention for decode: one query token per sequence against its cached K/V.

q[b] attends to cache positions 0 .. seq_lens[b] - 1 of sequence b (its newest token is already
in the cache). Position p of sequence b lives in cache block block_tables[b, p // block_size] at
offset p % block_size. GQA: query head h reads kv head h // (Hq // Hkv). seq_lens must be >= 1.

The Triton kernel runs one program per (sequence, kv head, split of the context): the program
takes all Hq // Hkv query heads of its kv head together, so each K/V tile is read once for the
whole group, and walks its part of the context in tiles of TILE_N positions with an online
softmax. With several splits (flash-decoding, for small batches) a second kernel merges them.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from kernels._checks import (
    ACTIVATION_DTYPES,
    check_positive_float,
    check_same_device,
    check_same_dtype,
    check_size,
    check_tensor,
    check_unit_last_stride,
)
from kernels import cpu_ext
from kernels._launch import launchable, next_power_of_2, on_interpreter

try:
    import triton
    import triton.language as tl
except ImportError:
    from kernels._no_triton import tl, triton

# Tokens per split are at least this many: below it the merge costs more than it gains.
MIN_SPLIT_TOKENS = 256
# The reference gathers about this many bytes of K/V at a time (see paged_attention_decode_reference).
# Measured on a 2-core Xeon, 32 streams decoding: 16 MiB beat 4 MiB by 5% at 150-token contexts
# and by 20% at 870, and one gather of everything (~43 MiB a layer at 870) by 2.8x.
GATHER_BYTES = 16 << 20


@triton.jit
def _decode_kernel(
    q_ptr,  # [B, Hq, D]
    k_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    v_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    block_tables_ptr,  # [B, max_blocks]
    seq_lens_ptr,  # [B]
    out_ptr,  # [B, Hq, D], written when NUM_SPLITS == 1
    part_max_ptr,  # [B, Hq, NUM_SPLITS] running max (log2 units), when NUM_SPLITS > 1
    part_sum_ptr,  # [B, Hq, NUM_SPLITS] softmax denominators
    part_acc_ptr,  # [B, Hq, NUM_SPLITS, D] unnormalized outputs
    scale_log2,  # softmax scale * log2(e)
    stride_qb,
    stride_qh,
    stride_cache_block,
    stride_cache_slot,
    stride_cache_head,
    stride_bt,
    stride_ob,
    stride_oh,
    num_q_heads,
    num_queries_per_kv,
    head_dim,
    split_size,  # positions per split, a multiple of TILE_N
    BLOCK_SIZE: tl.constexpr,  # cache block size
    BLOCK_G: tl.constexpr,  # >= num_queries_per_kv, >= 16 for tl.dot
    BLOCK_D: tl.constexpr,
    TILE_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * split_size
    end = tl.minimum(start + split_size, seq_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv_head * num_queries_per_kv + g  # [BLOCK_G]
    g_mask = g < num_queries_per_kv
    d_mask = d < head_dim
    q = tl.load(
        q_ptr + seq * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(DOT_DTYPE)  # [BLOCK_G, BLOCK_D]

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq * stride_bt
    head_offset = kv_head.to(tl.int64) * stride_cache_head
    for tile_start in range(start, end, TILE_N):
        pos = tile_start + tl.arange(0, TILE_N)  # [TILE_N]
        pos_mask = pos < end
        block = tl.load(table + pos // BLOCK_SIZE, mask=pos_mask, other=0).to(tl.int64)
        rows = block * stride_cache_block + (pos % BLOCK_SIZE) * stride_cache_slot + head_offset
        kv_mask = pos_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=DOT_PRECISION)
        scores = tl.where(pos_mask[None, :], scores * scale_log2, float("-inf"))  # [BLOCK_G, TILE_N]
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
        # p is rounded to the cache dtype as a tensor-core kernel would, even when DOT_DTYPE is wider
        p = p.to(v_cache_ptr.dtype.element_ty).to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p, v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
        m = m_new

    out_mask = g_mask[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:
        out = acc / tl.where(l == 0.0, 1.0, l)[:, None]
        out_ptrs = out_ptr + seq * stride_ob + heads[:, None] * stride_oh + d[None, :]
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        part = (seq * num_q_heads + heads) * NUM_SPLITS + split  # [BLOCK_G]
        tl.store(part_max_ptr + part, m, mask=g_mask)
        tl.store(part_sum_ptr + part, l, mask=g_mask)
        tl.store(part_acc_ptr + part[:, None] * head_dim + d[None, :], acc, mask=out_mask)


@triton.jit
def _decode_merge_kernel(
    part_max_ptr,  # [B, Hq, NUM_SPLITS]
    part_sum_ptr,  # [B, Hq, NUM_SPLITS]
    part_acc_ptr,  # [B, Hq, NUM_SPLITS, D]
    out_ptr,  # [B, Hq, D]
    stride_ob,
    stride_oh,
    num_q_heads,
    head_dim,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_mask = s < NUM_SPLITS
    d_mask = d < head_dim
    part = (seq * num_q_heads + head) * NUM_SPLITS + s  # [BLOCK_S]
    m = tl.load(part_max_ptr + part, mask=s_mask, other=float("-inf"))
    m_all = tl.max(m, axis=0)
    m_all = tl.where(m_all == float("-inf"), 0.0, m_all)
    weight = tl.exp2(m - m_all)  # 0 for splits past the sequence's end
    total = tl.sum(weight * tl.load(part_sum_ptr + part, mask=s_mask, other=0.0), axis=0)
    acc = tl.load(
        part_acc_ptr + part[:, None] * head_dim + d[None, :],
        mask=s_mask[:, None] & d_mask[None, :],
        other=0.0,
    )  # [BLOCK_S, BLOCK_D]
    out = tl.sum(weight[:, None] * acc, axis=0) / tl.where(total == 0.0, 1.0, total)
    out_ptrs = out_ptr + seq * stride_ob + head * stride_oh + d
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def check_paged_kv(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, scale: float
) -> None:
    """Checks shared by decode and prefill: q [N, Hq, D] against the caches and block tables."""
    check_tensor("q", q, ndim=3, dtypes=ACTIVATION_DTYPES)
    check_tensor("k_cache", k_cache, ndim=4, dtypes=ACTIVATION_DTYPES)
    check_tensor("v_cache", v_cache, ndim=4, dtypes=ACTIVATION_DTYPES)
    check_tensor("block_tables", block_tables, ndim=2, dtypes=(torch.int32,))
    check_same_dtype([("q", q), ("k_cache", k_cache), ("v_cache", v_cache)])
    if v_cache.shape != k_cache.shape:
        raise ValueError(
            f"v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}"
        )
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    if num_kv_heads == 0 or num_q_heads % num_kv_heads:
        raise ValueError(
            f"q.shape[1] (query heads, {num_q_heads}) must be a multiple of k_cache.shape[2] "
            f"(kv heads, {num_kv_heads})"
        )
    check_size("k_cache", k_cache, 3, head_dim, "q.shape[2], the head dim")
    check_positive_float("scale", scale)


def _check_args(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, scale: float
) -> None:
    check_paged_kv(q, k_cache, v_cache, block_tables, scale)
    check_tensor("seq_lens", seq_lens, ndim=1, dtypes=(torch.int32,))
    check_size("block_tables", block_tables, 0, q.shape[0], "q.shape[0], the batch size")
    check_size("seq_lens", seq_lens, 0, q.shape[0], "q.shape[0], the batch size")
    check_same_device(
        [("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables),
         ("seq_lens", seq_lens)]
    )


def softmax_times_v(scores: Tensor, v: Tensor, dtype: torch.dtype) -> Tensor:
    """softmax(scores) @ v for float32 scores [N, R, S] and v [N, S, D]. Below float32, as sdpa's CPU
    kernel and the Triton kernels do: the unnormalized weights exp(s - max) are rounded to `dtype`
    before the matmul and the sum of the unrounded ones divides after it."""
    if dtype == torch.float32:
        return torch.bmm(torch.softmax(scores, dim=-1), v)
    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    return torch.bmm(weights.to(dtype).float(), v).div_(weights.sum(dim=-1, keepdim=True))


def gather_heads(k_cache: Tensor, v_cache: Tensor, block_ids: Tensor) -> tuple[Tensor, Tensor]:
    """caches: [num_blocks, block_size, Hkv, D], block_ids: [n] int64 -> (K, V), each
    [Hkv, n * block_size, D], float32, contiguous: the positions of the listed blocks, in order,
    per kv head.

    Fast when a cache's storage is head-major (`cache.permute(2, 0, 1, 3)` contiguous, as the
    engine allocates it): one `index_select` of whole [block_size, D] slabs along dim 0 (the
    dim-0 copy runs on every thread; along dim 1 it ran several times slower on a CPU). Any
    other layout costs one more copy (gather the blocks, then move the heads first)."""
    num_blocks, _, num_kv_heads, head_dim = k_cache.shape
    head_offsets = torch.arange(num_kv_heads, device=block_ids.device)[:, None] * num_blocks  # [Hkv, 1]
    slab_ids = (head_offsets + block_ids).view(-1)  # [Hkv * n], rows of the head-major slabs

    def gather(cache: Tensor) -> Tensor:
        heads_first = cache.permute(2, 0, 1, 3)  # [Hkv, num_blocks, block_size, D]
        if heads_first.is_contiguous():
            gathered = heads_first.view(num_kv_heads * num_blocks, -1).index_select(0, slab_ids)
        else:
            gathered = cache.index_select(0, block_ids).permute(2, 0, 1, 3).contiguous()
        return gathered.view(num_kv_heads, -1, head_dim).float()

    return gather(k_cache), gather(v_cache)


def paged_attention_decode_reference(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
) -> Tensor:
    """q: [B, Hq, D]; caches: [num_blocks, block_size, Hkv, D]; block_tables: [B, max_blocks];
    seq_lens: [B] -> [B, Hq, D] in q's dtype. float32 math.

    Per group of sequences: gather their blocks head-major, then two batched matmuls over the
    padded context with a masked softmax between them, batched over (kv head, sequence). The
    Hq // Hkv query heads of a kv head are the rows of one matrix, so K/V are read once per
    group of heads and never expanded. Groups hold about GATHER_BYTES of gathered K/V, so that
    the matmuls read them back from the CPU's cache: one gather of a large batch's whole context
    spills to memory and runs several times slower.
    """
    _check_args(q, k_cache, v_cache, block_tables, seq_lens, scale)
    batch = q.shape[0]
    if batch == 0:
        return torch.empty_like(q)
    block_size = k_cache.shape[1]
    lens = seq_lens.tolist()
    max_len = max(lens)
    num_blocks = -(-max_len // block_size)
    if num_blocks > block_tables.shape[1]:
        raise ValueError(
            f"seq_lens up to {max_len} need {num_blocks} blocks, block_tables has "
            f"{block_tables.shape[1]} columns"
        )
    bytes_per_seq = 2 * k_cache.shape[2] * max_len * q.shape[2] * 4  # gathered float32 K and V
    group = max(1, GATHER_BYTES // bytes_per_seq)
    if group >= batch:
        return _decode_group(q, k_cache, v_cache, block_tables, seq_lens, max_len, scale)
    out = torch.empty_like(q)  # [B, Hq, D]
    for start in range(0, batch, group):
        rows = slice(start, start + group)
        out[rows] = _decode_group(q[rows], k_cache, v_cache, block_tables[rows], seq_lens[rows],
                                  max(lens[rows]), scale)
    return out


def _decode_group(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, max_len: int,
    scale: float,
) -> Tensor:
    """The reference's work for some sequences (`max_len` = max(seq_lens)); -> [B, Hq, D]."""
    batch, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    num_blocks = -(-max_len // block_size)
    length = num_blocks * block_size
    used = torch.arange(num_blocks, device=q.device) < (seq_lens[:, None] + block_size - 1) // block_size
    block_ids = torch.where(used, block_tables[:, :num_blocks], 0).reshape(-1).long()  # [B * nb]; junk -> 0
    k, v = gather_heads(k_cache, v_cache, block_ids)  # [Hkv, B * L, D] each
    k = k.view(num_kv_heads * batch, length, head_dim)  # [Hkv * B, L, D]
    v = v.view(num_kv_heads * batch, length, head_dim)
    rows = q.float().view(batch, num_kv_heads, group, head_dim).transpose(0, 1)  # [Hkv, B, G, D]
    rows = rows.reshape(num_kv_heads * batch, group, head_dim)
    scores = torch.bmm(rows, k.transpose(1, 2)).mul_(scale)  # [Hkv * B, G, L]
    hidden = torch.arange(length, device=q.device) >= seq_lens[:, None]  # [B, L]
    scores.view(num_kv_heads, batch, group, length).masked_fill_(hidden[None, :, None, :], float("-inf"))
    out = softmax_times_v(scores, v, q.dtype)  # [Hkv * B, G, D]
    out = out.view(num_kv_heads, batch, group, head_dim).transpose(0, 1)  # [B, Hkv, G, D]
    return out.reshape(batch, num_q_heads, head_dim).to(q.dtype)


def paged_attention_decode_cpu(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
) -> Tensor:
    """The hand-written CPU kernel (kernels/csrc/cpu_kernels.cpp); same contract as
    paged_attention_decode_reference. It reads K/V in place, position by position, with no
    gathered copy. RuntimeError when the library is not built (see kernels/cpu_ext.py)."""
    _check_args(q, k_cache, v_cache, block_tables, seq_lens, scale)
    for name, tensor in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables)):
        check_unit_last_stride(name, tensor)
    return cpu_ext.require_ops().paged_attention_decode(q, k_cache, v_cache, block_tables, seq_lens, scale)


def dot_config(q: Tensor) -> tuple[object, str]:
    """tl.dot operand dtype and input precision for q's dtype (see on_interpreter)."""
    if q.dtype == torch.float32 or on_interpreter(q.device):
        return tl.float32, "ieee"
    return tl.bfloat16, "tf32"


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(batch: int, num_kv_heads: int, max_context: int, device: torch.device) -> int:
    """Split the context when (sequence, kv head) programs alone would leave most SMs idle."""
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    target_programs = 4 * _num_sms(index)
    want = -(-target_programs // max(batch * num_kv_heads, 1))
    return max(1, min(want, max_context // MIN_SPLIT_TOKENS))


def paged_attention_decode_triton(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    tile_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
) -> Tensor:
    """Triton paged decode attention; same contract as paged_attention_decode_reference.

    The keyword-only knobs are for tests and tuning: num_splits=None picks from the batch size
    and the block table's width (host-side numbers only, so no device sync and graph-safe).
    """
    _check_args(q, k_cache, v_cache, block_tables, seq_lens, scale)
    for name, tensor in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_unit_last_stride(name, tensor)
    if v_cache.stride() != k_cache.stride():
        raise ValueError(
            f"v_cache must have k_cache's strides {k_cache.stride()}, got {v_cache.stride()}"
        )
    check_unit_last_stride("block_tables", block_tables)
    batch, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty((batch, num_q_heads, head_dim), dtype=q.dtype, device=q.device)  # [B, Hq, D]
    if batch == 0:
        return out
    max_context = block_tables.shape[1] * block_size  # host-side bound on every seq_len
    if num_splits is None:
        num_splits = choose_num_splits(batch, num_kv_heads, max_context, q.device)
    split_size = _round_up(max(-(-max_context // num_splits), 1), tile_n)
    num_splits = max(1, -(-max_context // split_size))  # rounding up may leave fewer splits
    kernel = launchable(_decode_kernel, q.device)
    dot_dtype, dot_precision = dot_config(q)
    block_d = max(next_power_of_2(head_dim), 16)
    if num_splits == 1:
        part_max = part_sum = part_acc = out  # unused
    else:
        part_max = torch.empty((batch, num_q_heads, num_splits), dtype=torch.float32, device=q.device)
        part_sum = torch.empty_like(part_max)
        part_acc = torch.empty(
            (batch, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
    num_queries_per_kv = num_q_heads // num_kv_heads
    kernel[(batch, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        part_max,
        part_sum,
        part_acc,
        scale * math.log2(math.e),
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        num_q_heads,
        num_queries_per_kv,
        head_dim,
        split_size,
        BLOCK_SIZE=block_size,
        BLOCK_G=max(next_power_of_2(num_queries_per_kv), 16),
        BLOCK_D=block_d,
        TILE_N=tile_n,
        NUM_SPLITS=num_splits,
        DOT_DTYPE=dot_dtype,
        DOT_PRECISION=dot_precision,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if num_splits > 1:
        launchable(_decode_merge_kernel, q.device)[(batch, num_q_heads)](
            part_max,
            part_sum,
            part_acc,
            out,
            out.stride(0),
            out.stride(1),
            num_q_heads,
            head_dim,
            NUM_SPLITS=num_splits,
            BLOCK_S=next_power_of_2(num_splits),
            BLOCK_D=block_d,
            num_warps=4,
        )
    return out
