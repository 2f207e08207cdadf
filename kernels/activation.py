"""Fused SiLU-and-multiply of the gated MLP: out = silu(x[:, :I]) * x[:, I:].

Rounded where transformers rounds: silu(gate) to x's dtype, then the product (float32: no rounding).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels._checks import ACTIVATION_DTYPES, check_tensor, check_unit_last_stride
from kernels._launch import launchable, next_power_of_2

try:
    import triton
    import triton.language as tl
except ImportError:
    from kernels._no_triton import tl, triton


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,  # [T, 2 * I]
    out_ptr,  # [T, I]
    stride_x,
    stride_out,
    intermediate_size,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < intermediate_size
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)  # [BLOCK]
    up = tl.load(x_ptr + row * stride_x + intermediate_size + cols, mask=mask, other=0.0)
    dtype = out_ptr.dtype.element_ty
    out = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32) * up.to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, out.to(dtype), mask=mask)


def _check_args(x: Tensor) -> None:
    check_tensor("x", x, ndim=2, dtypes=ACTIVATION_DTYPES)
    if x.shape[1] % 2:
        raise ValueError(f"x.shape[1] must be even (gate and up halves), got {tuple(x.shape)}")


def silu_and_mul_reference(x: Tensor) -> Tensor:
    """x: [T, 2 * I] -> [T, I] in x's dtype."""
    _check_args(x)
    gate, up = x.chunk(2, dim=-1)  # [T, I] each
    return F.silu(gate) * up


def silu_and_mul_triton(x: Tensor) -> Tensor:
    """Triton SiLU-and-multiply; same contract as silu_and_mul_reference."""
    _check_args(x)
    check_unit_last_stride("x", x)
    num_tokens, intermediate_size = x.shape[0], x.shape[1] // 2
    out = torch.empty((num_tokens, intermediate_size), dtype=x.dtype, device=x.device)  # [T, I]
    if out.numel() == 0:
        return out
    block = min(next_power_of_2(intermediate_size), 1024)
    kernel = launchable(_silu_and_mul_kernel, x.device)
    kernel[(num_tokens, -(-intermediate_size // block))](
        x, out, x.stride(0), out.stride(0), intermediate_size, BLOCK=block, num_warps=4
    )
    return out
