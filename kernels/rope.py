"""Rotary position embedding (NeoX / Llama rotate_half layout), in place on q and k.

For each head vector x of size D with halves x1 = x[:D/2], x2 = x[D/2:] and the angle table of
position p: x1' = x1 * cos - x2 * sin, x2' = x2 * cos + x1 * sin, rounded where transformers rounds: cos and sin
to x's dtype, then each product and each sum (float32: no rounding at all).
cos_sin_cache[p] = cat(cos(p * inv_freq), sin(p * inv_freq)), built by make_cos_sin_cache.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels._checks import (
    ACTIVATION_DTYPES,
    check_same_device,
    check_same_dtype,
    check_size,
    check_tensor,
    check_unit_last_stride,
)
from kernels._launch import launchable, next_power_of_2

try:
    import triton
    import triton.language as tl
except ImportError:
    from kernels._no_triton import tl, triton


def make_cos_sin_cache(
    max_pos: int,
    head_dim: int,
    theta: float,
    device: torch.device | str | None = None,
    inv_freq: Tensor | None = None,
) -> Tensor:
    """The [max_pos, head_dim] float32 table rotary() reads: cat(cos, sin) of p * inv_freq.

    inv_freq defaults to plain Llama rope, 1 / theta ** (arange(0, D, 2) / D), computed in float32
    exactly as Hugging Face does; pass a [D/2] tensor to use a scaled variant (llama3, YaRN...).
    """
    if max_pos < 1:
        raise ValueError(f"max_pos must be >= 1, got {max_pos}")
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be even and >= 2, got {head_dim}")
    if inv_freq is None:
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float()
        inv_freq = 1.0 / (theta ** (exponents / head_dim))  # [D/2]
    else:
        check_tensor("inv_freq", inv_freq, ndim=1, dtypes=(torch.float32, torch.float64))
        check_size("inv_freq", inv_freq, 0, head_dim // 2, "head_dim / 2")
        inv_freq = inv_freq.to(device=device, dtype=torch.float32)
    positions = torch.arange(max_pos, dtype=torch.int64, device=inv_freq.device).float()  # [P]
    angles = torch.outer(positions, inv_freq)  # [P, D/2]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)  # [P, D]


@triton.jit
def _rotate_first(a, b, cos, sin, dtype):
    """a * cos - b * sin rounded where transformers rounds: cos, sin, each product, the sum."""
    cos = cos.to(dtype).to(tl.float32)
    sin = sin.to(dtype).to(tl.float32)
    return ((a * cos).to(dtype).to(tl.float32) - (b * sin).to(dtype).to(tl.float32)).to(dtype)


@triton.jit
def _rotary_kernel(
    q_ptr,  # [T, Hq, D]
    k_ptr,  # [T, Hkv, D]
    positions_ptr,  # [T]
    cos_sin_ptr,  # [max_pos, D]
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cache,
    num_q_heads,
    num_kv_heads,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HKV: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token)
    d = tl.arange(0, BLOCK_HALF)
    d_mask = d < HALF
    cos = tl.load(cos_sin_ptr + position * stride_cache + d, mask=d_mask, other=0.0)[None, :]
    sin = tl.load(cos_sin_ptr + position * stride_cache + HALF + d, mask=d_mask, other=0.0)[None, :]

    heads = tl.arange(0, BLOCK_HQ)
    mask = (heads < num_q_heads)[:, None] & d_mask[None, :]  # [BLOCK_HQ, BLOCK_HALF]
    first = q_ptr + token * stride_qt + heads[:, None] * stride_qh + d[None, :]
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(first, _rotate_first(x1, x2, cos, sin, q_ptr.dtype.element_ty), mask=mask)
    tl.store(first + HALF, _rotate_first(x2, -x1, cos, sin, q_ptr.dtype.element_ty), mask=mask)

    heads = tl.arange(0, BLOCK_HKV)
    mask = (heads < num_kv_heads)[:, None] & d_mask[None, :]  # [BLOCK_HKV, BLOCK_HALF]
    first = k_ptr + token * stride_kt + heads[:, None] * stride_kh + d[None, :]
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(first, _rotate_first(x1, x2, cos, sin, k_ptr.dtype.element_ty), mask=mask)
    tl.store(first + HALF, _rotate_first(x2, -x1, cos, sin, k_ptr.dtype.element_ty), mask=mask)


def _check_args(q: Tensor, k: Tensor, positions: Tensor, cos_sin_cache: Tensor) -> None:
    check_tensor("q", q, ndim=3, dtypes=ACTIVATION_DTYPES)
    check_tensor("k", k, ndim=3, dtypes=ACTIVATION_DTYPES)
    check_same_dtype([("q", q), ("k", k)])
    check_tensor("positions", positions, ndim=1, dtypes=(torch.int64,))
    check_tensor("cos_sin_cache", cos_sin_cache, ndim=2, dtypes=(torch.float32,))
    num_tokens, _, head_dim = q.shape
    if head_dim % 2:
        raise ValueError(f"q.shape[2] (head_dim) must be even, got {tuple(q.shape)}")
    check_size("k", k, 0, num_tokens, "q.shape[0], the number of tokens")
    check_size("k", k, 2, head_dim, "q.shape[2], the head dim")
    check_size("positions", positions, 0, num_tokens, "q.shape[0], the number of tokens")
    check_size("cos_sin_cache", cos_sin_cache, 1, head_dim, "q.shape[2], the head dim")
    check_same_device([("q", q), ("k", k), ("positions", positions), ("cos_sin_cache", cos_sin_cache)])


def rotary_reference(q: Tensor, k: Tensor, positions: Tensor, cos_sin_cache: Tensor) -> None:
    """q: [T, Hq, D], k: [T, Hkv, D], positions: [T] int64, cos_sin_cache: [P, D]; in place."""
    _check_args(q, k, positions, cos_sin_cache)
    half = q.shape[2] // 2
    cos_sin = cos_sin_cache.index_select(0, positions)  # [T, D]
    for x in (q, k):
        dtype = x.dtype
        cos, sin = (t.to(dtype) for t in (cos_sin[:, None, :half], cos_sin[:, None, half:]))  # [T, 1, D/2] each
        x1, x2 = x[..., :half], x[..., half:]  # [T, H, D/2] each; products and sums round to dtype
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)  # [T, H, D]
        x.copy_(rotated)


def rotary_triton(q: Tensor, k: Tensor, positions: Tensor, cos_sin_cache: Tensor) -> None:
    """Triton rotary embedding; same contract as rotary_reference."""
    _check_args(q, k, positions, cos_sin_cache)
    for name, tensor in (("q", q), ("k", k), ("cos_sin_cache", cos_sin_cache)):
        check_unit_last_stride(name, tensor)
    num_tokens, num_q_heads, head_dim = q.shape
    if num_tokens == 0:
        return
    half = head_dim // 2
    kernel = launchable(_rotary_kernel, q.device)
    kernel[(num_tokens,)](
        q,
        k,
        positions,
        cos_sin_cache,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos_sin_cache.stride(0),
        num_q_heads,
        k.shape[1],
        HALF=half,
        BLOCK_HALF=next_power_of_2(half),
        BLOCK_HQ=next_power_of_2(num_q_heads),
        BLOCK_HKV=next_power_of_2(k.shape[1]),
        num_warps=4,
    )
