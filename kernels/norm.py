"""RMSNorm, plain and fused with the residual add: one Triton kernel and its torch reference.

out = x / sqrt(mean(x**2) + eps) * weight, with transformers' rounding points: the normalized x is
rounded to x's dtype, then multiplied by weight and rounded again (float32: no rounding at all).
The fused form first rounds residual_out = x + residual to x's dtype (as the unfused model does)
and normalizes that rounded value.
"""

from __future__ import annotations

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
from kernels._launch import launchable, next_power_of_2

try:
    import triton
    import triton.language as tl
except ImportError:
    from kernels._no_triton import tl, triton


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [T, H]
    residual_ptr,  # [T, H], read only when HAS_RESIDUAL
    weight_ptr,  # [H]
    out_ptr,  # [T, H]
    residual_out_ptr,  # [T, H], written only when HAS_RESIDUAL
    stride_x,
    stride_residual,
    stride_out,
    stride_residual_out,
    hidden_size,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < hidden_size
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_H]
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
        summed = (x + residual.to(tl.float32)).to(residual_out_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * stride_residual_out + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    variance = tl.sum(x * x, axis=0) / hidden_size
    rstd = 1.0 / tl.sqrt(variance + eps)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    out = (x * rstd).to(dtype).to(tl.float32) * weight
    tl.store(out_ptr + row * stride_out + cols, out.to(dtype), mask=mask)


def _check_args(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float) -> None:
    check_tensor("x", x, ndim=2, dtypes=ACTIVATION_DTYPES)
    named = [("x", x), ("weight", weight)]
    if residual is not None:
        check_tensor("residual", residual, ndim=2, dtypes=ACTIVATION_DTYPES)
        if residual.shape != x.shape:
            raise ValueError(
                f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}"
            )
        check_same_dtype([("x", x), ("residual", residual)])
        named.append(("residual", residual))
    check_tensor("weight", weight, ndim=1, dtypes=ACTIVATION_DTYPES)
    check_size("weight", weight, 0, x.shape[1], "x.shape[1], the hidden size")
    check_same_device(named)
    check_positive_float("eps", eps)


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x: [T, H], weight: [H] -> [T, H] in x's dtype."""
    _check_args(x, None, weight, eps)
    xf = x.float()  # [T, H]
    rstd = torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps)  # [T, 1]
    normed = (xf * rstd).to(x.dtype).float()  # [T, H]
    return (normed * weight.float()).to(x.dtype)


def fused_add_rms_norm_reference(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    """x, residual: [T, H], weight: [H] -> (rms_norm(x + residual), x + residual); inputs untouched."""
    _check_args(x, residual, weight, eps)
    residual_out = (x.float() + residual.float()).to(x.dtype)  # [T, H]
    return rms_norm_reference(residual_out, weight, eps), residual_out


def _launch(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    check_unit_last_stride("x", x)
    check_unit_last_stride("weight", weight)
    if residual is not None:
        check_unit_last_stride("residual", residual)
    num_tokens, hidden_size = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)  # [T, H]
    residual_out = out if residual is None else torch.empty_like(out)  # [T, H]
    if num_tokens == 0:
        return out, residual_out
    block_h = next_power_of_2(hidden_size)
    kernel = launchable(_rms_norm_kernel, x.device)
    kernel[(num_tokens,)](
        x,
        x if residual is None else residual,
        weight,
        out,
        residual_out,
        x.stride(0),
        x.stride(0) if residual is None else residual.stride(0),
        out.stride(0),
        residual_out.stride(0),
        hidden_size,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK_H=block_h,
        num_warps=min(max(block_h // 512, 1), 16),
    )
    return out, residual_out


def rms_norm_triton(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Triton RMSNorm; same contract as rms_norm_reference."""
    _check_args(x, None, weight, eps)
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm_triton(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    """Triton residual add + RMSNorm; same contract as fused_add_rms_norm_reference."""
    _check_args(x, residual, weight, eps)
    return _launch(x, residual, weight, eps)
