"""Token sampling: temperature, top-k, top-p, min-p, then a reproducible random pick per row.

Per row b (vLLM's semantics):
- temperature[b] <= 0: greedy, the first index of the largest logit; the other knobs are ignored.
- z = logits * (1 / temperature); the distribution is softmax(z) over the kept tokens.
- top-k (top_k[b] in 1..V-1, 0 = off): keep tokens whose logit is >= the k-th largest logit
  (ties with the k-th are all kept).
- top-p (top_p[b] < 1, 1.0 = off): of those, keep the smallest set whose probability reaches
  top_p: token j stays iff the kept mass strictly above it is < top_p (the top token always stays).
- min-p (min_p[b] > 0, 0.0 = off): drop tokens with prob < min_p * max prob,
  i.e. exp(z_j - z_max) < min_p.
- pick argmax over kept j of z_j + Gumbel noise. The noise comes from a counter-based hash of
  (seeds[b], offsets[b], j) alone, so a row's pick never depends on its batch mates or position;
  offsets[b] is how many tokens the sequence has generated so far.

The Triton kernel and the torch reference use the same hash and the same float32 formulas and so
pick the same token, barring floating-point near-ties at a mask boundary or between two noisy
scores (the kernel's exp/log and sums may differ from torch's in the last bits).

The kernel runs one program per row and finds the top-k and top-p cut-offs by bisection over the
logits' order-preserving int32 keys (one pass over the row per step, at most 32 steps each), so
it needs no sort and the thresholds are exact.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels import cpu_ext
from kernels._checks import check_same_device, check_size, check_tensor, check_unit_last_stride
from kernels._launch import launchable, next_power_of_2

try:
    import triton
    import triton.language as tl
except ImportError:
    from kernels._no_triton import tl, triton

_MASK32 = 0xFFFFFFFF
_MUL1 = 0x7FEB352D  # lowbias32 multipliers (Chris Wellons' hash-prospector)
_MUL2 = 0x846CA68B
_SEED_SALT = 0x9E3779B9
_ROW_SALT = 0x85EBCA6B


def _mul32(x: Tensor, c: int) -> Tensor:
    """(x * c) mod 2**32 for int64 x in [0, 2**32), without int64 overflow."""
    if c < 1 << 31:
        return (x * c) & _MASK32
    # x * 2**31 mod 2**32 is the low bit of x moved to bit 31
    return (x * (c - (1 << 31)) + ((x & 1) << 31)) & _MASK32


def _mix32(x: Tensor) -> Tensor:
    """lowbias32 on int64 tensors holding uint32 values; the kernel's _mix32 in uint32."""
    x = x ^ (x >> 16)
    x = _mul32(x, _MUL1)
    x = x ^ (x >> 15)
    x = _mul32(x, _MUL2)
    return x ^ (x >> 16)


def row_keys(seeds: Tensor, offsets: Tensor) -> Tensor:
    """seeds, offsets: [B] int64 -> [B, 2] int64 holding uint32 hash keys of (seed, offset)."""
    h = _mix32((seeds & _MASK32) ^ _SEED_SALT)
    h = _mix32(h ^ ((seeds >> 32) & _MASK32))
    h = _mix32(h ^ (offsets & _MASK32))
    h = _mix32(h ^ ((offsets >> 32) & _MASK32))
    return torch.stack([h, _mix32(h ^ _ROW_SALT)], dim=-1)


def gumbel_noise(keys: Tensor, columns: Tensor) -> Tensor:
    """keys: [N, 2] from row_keys, columns: [N, M] int64 vocab ids -> [N, M] float32 noise.

    u = (top 23 bits of the hash + 0.5) / 2**23 lies in (0, 1); the noise is -log(-log(u)),
    which lies in [-2.9, 16.7] (GUMBEL_MAX bounds it).
    """
    bits = _mix32(_mix32(columns ^ keys[:, :1]) ^ keys[:, 1:])  # [N, M]
    u = ((bits >> 9).float() + 0.5) * (1.0 / 8388608.0)
    return -torch.log(-torch.log(u))


GUMBEL_MAX = 16.7  # > -log(-log(1 - 2**-24)) = 16.64, the largest noise gumbel_noise can give


def inverse_temperature(temperature: Tensor) -> Tensor:
    """[B] -> [B] float32: 1 / temperature where temperature > 0, else 1 (greedy rows)."""
    return torch.where(temperature > 0, 1.0 / temperature, torch.ones_like(temperature))


@triton.jit
def _tl_order_key(x):
    """float32 -> int32 with the floats' order (-0.0 and +0.0 both map to 0)."""
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _tl_mix32(x):
    """lowbias32 on uint32; must match the torch _mix32 above bit for bit."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _sample_kernel(
    logits_ptr,  # [B, V] float32
    temperature_ptr,  # [B] float32
    inv_temperature_ptr,  # [B] float32, from inverse_temperature()
    top_k_ptr,  # [B] int32
    top_p_ptr,  # [B] float32
    min_p_ptr,  # [B] float32
    keys_ptr,  # [B, 2] int64, from row_keys()
    out_ptr,  # [B] int64
    stride_row,
    vocab_size,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    logits = logits_ptr + row * stride_row
    lanes = tl.arange(0, BLOCK_V)

    # Pass 1: the row's largest logit (first index on ties) and smallest logit.
    best = tl.full([BLOCK_V], float("-inf"), tl.float32)
    best_col = tl.zeros([BLOCK_V], tl.int32)
    lowest = tl.full([BLOCK_V], float("inf"), tl.float32)
    for start in range(0, vocab_size, BLOCK_V):
        cols = start + lanes
        in_row = cols < vocab_size
        x = tl.load(logits + cols, mask=in_row, other=float("-inf"))  # [BLOCK_V]
        better = x > best
        best = tl.where(better, x, best)
        best_col = tl.where(better, cols, best_col)
        lowest = tl.minimum(lowest, tl.where(in_row, x, float("inf")))
    x_max = tl.max(best, axis=0)
    token = tl.min(tl.where(best == x_max, best_col, vocab_size), axis=0)

    temperature = tl.load(temperature_ptr + row)
    if temperature > 0.0:
        inv_t = tl.load(inv_temperature_ptr + row)
        top_k = tl.load(top_k_ptr + row)
        top_p = tl.load(top_p_ptr + row)
        min_p = tl.load(min_p_ptr + row)
        z_max = x_max * inv_t
        key_max = _tl_order_key(x_max).to(tl.int64)

        # top-k: the largest key K with count(key >= K) >= top_k is the k-th largest logit's.
        k_floor = _tl_order_key(tl.min(lowest, axis=0)).to(tl.int64)
        if (top_k > 0) & (top_k < vocab_size):
            hi = key_max
            while k_floor < hi:
                mid = k_floor + (hi - k_floor + 1) // 2
                count = tl.zeros([BLOCK_V], tl.int32)
                for start in range(0, vocab_size, BLOCK_V):
                    cols = start + lanes
                    x = tl.load(logits + cols, mask=cols < vocab_size, other=float("-inf"))
                    count += ((cols < vocab_size) & (_tl_order_key(x) >= mid)).to(tl.int32)
                if tl.sum(count, axis=0) >= top_k:
                    k_floor = mid
                else:
                    hi = mid - 1

        # top-p: the smallest key K >= k_floor whose strictly-greater kept mass is < top_p.
        p_floor = k_floor
        if top_p < 1.0:
            mass = tl.zeros([BLOCK_V], tl.float32)
            for start in range(0, vocab_size, BLOCK_V):
                cols = start + lanes
                x = tl.load(logits + cols, mask=cols < vocab_size, other=float("-inf"))
                kept = (cols < vocab_size) & (_tl_order_key(x) >= k_floor)
                mass += tl.where(kept, tl.exp(x * inv_t - z_max), 0.0)
            target = top_p * tl.sum(mass, axis=0)
            hi = key_max
            while p_floor < hi:
                mid = p_floor + (hi - p_floor) // 2
                mass = tl.zeros([BLOCK_V], tl.float32)
                for start in range(0, vocab_size, BLOCK_V):
                    cols = start + lanes
                    x = tl.load(logits + cols, mask=cols < vocab_size, other=float("-inf"))
                    above = (cols < vocab_size) & (_tl_order_key(x) > mid)
                    mass += tl.where(above, tl.exp(x * inv_t - z_max), 0.0)
                if tl.sum(mass, axis=0) < target:
                    hi = mid
                else:
                    p_floor = mid + 1

        # min-p, Gumbel noise, and the pick.
        key_a = tl.load(keys_ptr + row * 2).to(tl.uint32)
        key_b = tl.load(keys_ptr + row * 2 + 1).to(tl.uint32)
        best = tl.full([BLOCK_V], float("-inf"), tl.float32)
        best_col = tl.zeros([BLOCK_V], tl.int32)
        for start in range(0, vocab_size, BLOCK_V):
            cols = start + lanes
            x = tl.load(logits + cols, mask=cols < vocab_size, other=float("-inf"))
            z = x * inv_t
            kept = (cols < vocab_size) & (_tl_order_key(x) >= p_floor)
            kept = kept & (tl.exp(z - z_max) >= min_p)
            bits = _tl_mix32(_tl_mix32(cols.to(tl.uint32) ^ key_a) ^ key_b)
            u = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
            score = tl.where(kept, z - tl.log(-tl.log(u)), float("-inf"))
            better = score > best
            best = tl.where(better, score, best)
            best_col = tl.where(better, cols, best_col)
        top = tl.max(best, axis=0)
        token = tl.min(tl.where(best == top, best_col, vocab_size), axis=0)
    tl.store(out_ptr + row, token.to(tl.int64))


def _check_args(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    min_p: Tensor,
    seeds: Tensor | None = None,
    offsets: Tensor | None = None,
) -> None:
    check_tensor("logits", logits, ndim=2, dtypes=(torch.float32,))
    if logits.shape[1] == 0:
        raise ValueError(f"logits must have at least one column, got shape {tuple(logits.shape)}")
    lanes = [
        ("temperature", temperature, torch.float32),
        ("top_k", top_k, torch.int32),
        ("top_p", top_p, torch.float32),
        ("min_p", min_p, torch.float32),
    ]
    if seeds is not None and offsets is not None:
        lanes += [("seeds", seeds, torch.int64), ("offsets", offsets, torch.int64)]
    for name, tensor, dtype in lanes:
        check_tensor(name, tensor, ndim=1, dtypes=(dtype,))
        check_size(name, tensor, 0, logits.shape[0], "logits.shape[0], the batch size")
    check_same_device([("logits", logits)] + [(name, tensor) for name, tensor, _ in lanes])


def _cutoffs(logits: Tensor, inv_t: Tensor, z_max: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """[B, 1]: the smallest logit top-k and top-p keep in each row (-inf where both are off).

    Only the rows' largest logits are sorted (torch.topk), widening until every row's cut-off
    falls inside (a flat distribution with top_p near 1 ends up sorting whole rows); the top-p
    mass is the full row's, summed unsorted.
    """
    batch, vocab_size = logits.shape
    k_on = (top_k > 0) & (top_k < vocab_size)
    p_on = top_p < 1.0
    either = k_on | p_on
    k = torch.where(k_on, top_k, vocab_size).long()  # [B]
    width = min(vocab_size, max(int(k[k_on].max()) if bool(k_on.any()) else 1, 256))
    top = logits.topk(width, dim=-1).values  # [B, width], descending
    k_floor = torch.where(k_on[:, None], top.gather(1, k.clamp(max=width)[:, None] - 1), -torch.inf)
    total = torch.ones_like(k_floor)  # [B, 1] the top-k kept mass (unused without top-p)
    if bool(p_on.any()):
        total = torch.where(logits >= k_floor, torch.exp(logits * inv_t - z_max), 0.0).sum(
            dim=-1, keepdim=True
        )
    while True:
        in_k = top >= k_floor  # [B, width], a prefix
        e = torch.where(in_k, torch.exp(top * inv_t - z_max), 0.0)  # [B, width]
        above = torch.cat([torch.zeros_like(e[:, :1]), e.cumsum(dim=-1)[:, :-1]], dim=-1)
        in_p = (above < top_p[:, None] * total) | ~p_on[:, None]  # mass strictly before j
        in_p[:, 0] = True
        num_kept = (in_k & in_p).sum(dim=-1, keepdim=True)  # [B, 1], a prefix, >= 1
        if width == vocab_size or bool(((num_kept < width) | ~either[:, None]).all()):
            break
        width = min(4 * width, vocab_size)
        top = logits.topk(width, dim=-1).values
    return torch.where(either[:, None], top.gather(1, num_kept - 1), float("-inf"))


def sampling_mask(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor
) -> Tensor:
    """[B, V] bool: the tokens sample() may pick in each row (the argmax alone for greedy rows)."""
    _check_args(logits, temperature, top_k, top_p, min_p)
    inv_t = inverse_temperature(temperature)[:, None]  # [B, 1]
    z_max = logits.max(dim=-1, keepdim=True).values * inv_t  # [B, 1]
    vocab_size = logits.shape[1]
    if bool((((top_k > 0) & (top_k < vocab_size)) | (top_p < 1.0)).any()):
        keep = logits >= _cutoffs(logits, inv_t, z_max, top_k, top_p)  # [B, V]
    else:
        keep = torch.ones_like(logits, dtype=torch.bool)
    if bool((min_p > 0).any()):
        keep &= torch.exp(logits * inv_t - z_max) >= min_p[:, None]
    greedy = temperature <= 0
    if bool(greedy.any()):
        one_hot = torch.zeros_like(keep)
        one_hot.scatter_(1, logits.argmax(dim=-1, keepdim=True), True)
        keep = torch.where(greedy[:, None], one_hot, keep)
    return keep


def _noisy_argmax(z: Tensor, keys: Tensor) -> Tensor:
    """z: [B, V] with -inf off the kept set -> [B] argmax of z + gumbel_noise (first on ties).

    Noise is drawn only where it can matter: the best noisy score among a row's 16 largest z is a
    floor for the winner, and a token with z below floor - GUMBEL_MAX - 1 cannot reach it.
    """
    batch, vocab_size = z.shape
    top_z, top_cols = z.topk(min(vocab_size, 16), dim=-1)  # [B, n]
    floor = (top_z + gumbel_noise(keys, top_cols)).max(dim=-1, keepdim=True).values  # [B, 1]
    rows, cols = (z >= floor - (GUMBEL_MAX + 1.0)).nonzero(as_tuple=True)  # [N] each
    scores = z[rows, cols] + gumbel_noise(keys[rows], cols[:, None]).squeeze(1)  # [N]
    best = torch.full((batch,), float("-inf"), device=z.device)
    best = best.scatter_reduce(0, rows, scores, "amax")
    winners = scores == best[rows]
    token = torch.full((batch,), vocab_size, dtype=torch.int64, device=z.device)
    return token.scatter_reduce(0, rows[winners], cols[winners], "amin")


def sample_reference(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    min_p: Tensor,
    seeds: Tensor,
    offsets: Tensor,
    *,
    cpu_argmax: bool = False,
) -> Tensor:
    """logits: [B, V] float32; temperature, top_p, min_p: [B] float32; top_k: [B] int32;
    seeds, offsets: [B] int64 -> [B] int64 token ids. `cpu_argmax`: greedy picks by the C++
    kernel (kernels/csrc/argmax.cpp; the same indices, ~13x faster than aten's on CPU)."""
    _check_args(logits, temperature, top_k, top_p, min_p, seeds, offsets)
    if cpu_argmax and logits.stride(-1) == 1:
        greedy = cpu_ext.require_ops().argmax_rows(logits)
    else:
        greedy = logits.argmax(dim=-1)  # [B]
    sampled_rows = temperature > 0
    if not bool(sampled_rows.any()):
        return greedy
    keep = sampling_mask(logits, temperature, top_k, top_p, min_p)  # [B, V]
    z = logits * inverse_temperature(temperature)[:, None]  # [B, V]
    picked = _noisy_argmax(z.masked_fill(~keep, float("-inf")), row_keys(seeds, offsets))
    return torch.where(sampled_rows, picked, greedy)


def sample_triton(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    min_p: Tensor,
    seeds: Tensor,
    offsets: Tensor,
) -> Tensor:
    """Triton sampler; same contract (and, barring float near-ties, same picks) as sample_reference."""
    _check_args(logits, temperature, top_k, top_p, min_p, seeds, offsets)
    check_unit_last_stride("logits", logits)
    batch, vocab_size = logits.shape
    out = torch.empty(batch, dtype=torch.int64, device=logits.device)  # [B]
    if batch == 0:
        return out
    kernel = launchable(_sample_kernel, logits.device)
    block_v = min(next_power_of_2(vocab_size), 4096)
    kernel[(batch,)](
        logits,
        temperature,
        inverse_temperature(temperature),
        top_k,
        top_p,
        min_p,
        row_keys(seeds, offsets),
        out,
        logits.stride(0),
        vocab_size,
        BLOCK_V=block_v,
        num_warps=8 if block_v >= 2048 else 4,
    )
    return out
