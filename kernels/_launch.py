"""Helpers shared by the Triton wrappers: which kernel object to launch, and small numbers."""

from __future__ import annotations

import functools
from typing import Any

import torch

from kernels._no_triton import MissingKernel


@functools.cache
def has_triton() -> bool:
    """True when the `triton` package can be imported."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def launchable(kernel: Any, device: torch.device) -> Any:
    """`kernel`, checked to be launchable for tensors on `device`.

    CUDA tensors launch the compiled kernel. CPU tensors need Triton's interpreter, which
    `@triton.jit` (triton's own library functions included) selects only when TRITON_INTERPRET=1
    is set before triton is first imported; otherwise this raises RuntimeError saying so.
    """
    if isinstance(kernel, MissingKernel):
        kernel[None]  # raises ModuleNotFoundError naming the kernel
    if device.type == "cuda":
        return kernel
    from triton.runtime.interpreter import InterpretedFunction

    if device.type == "cpu" and isinstance(kernel, InterpretedFunction):
        return kernel
    if device.type == "cpu":
        raise RuntimeError(
            f"Triton kernel {kernel.fn.__name__} got CPU tensors but triton was imported without "
            "TRITON_INTERPRET=1; set it before triton is first imported to run the kernels in "
            "Triton's interpreter, or use SWITCHYARD_KERNELS=torch/auto for the torch references"
        )
    raise ValueError(f"Triton kernels take CUDA tensors (or CPU ones, interpreted), got {device}")


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (n >= 1); a triton-free copy of triton.next_power_of_2."""
    return 1 << (max(n, 1) - 1).bit_length()


def on_interpreter(device: torch.device) -> bool:
    """True when kernels for `device` run in Triton's interpreter (numpy on the CPU).

    The interpreter multiplies bfloat16 `tl.dot` operands as their raw uint16 bits (triton 3.x),
    so the attention kernels upcast dot operands to float32 there; the math is unchanged because
    a bfloat16 product is exact in float32.
    """
    return device.type != "cuda"
