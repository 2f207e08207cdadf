"""Write the new tokens' K and V into the paged cache: cache.view(-1, Hkv, D)[slot[t]] = k[t].

A slot is block_index * block_size + offset_in_block. Slots must lie in
[0, num_blocks * block_size); the kernel does not check them (that would cost a device sync).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels import cpu_ext
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


@triton.jit
def _reshape_and_cache_kernel(
    k_ptr,  # [T, Hkv, D]
    v_ptr,  # [T, Hkv, D]
    k_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    v_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    slot_mapping_ptr,  # [T]
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cache_block,
    stride_cache_slot,
    stride_cache_head,
    num_kv_heads,
    head_dim,
    block_size,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    block = slot // block_size
    offset = slot % block_size
    heads = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (heads < num_kv_heads)[:, None] & (d < head_dim)[None, :]  # [BLOCK_H, BLOCK_D]
    dst = block * stride_cache_block + offset * stride_cache_slot
    dst = dst + heads[:, None] * stride_cache_head + d[None, :]
    k = tl.load(k_ptr + token * stride_kt + heads[:, None] * stride_kh + d[None, :], mask=mask)
    tl.store(k_cache_ptr + dst, k, mask=mask)
    v = tl.load(v_ptr + token * stride_vt + heads[:, None] * stride_vh + d[None, :], mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def _check_args(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    for name, tensor in (("k", k), ("v", v)):
        check_tensor(name, tensor, ndim=3, dtypes=ACTIVATION_DTYPES)
    for name, tensor in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, tensor, ndim=4, dtypes=ACTIVATION_DTYPES)
    check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=(torch.int64,))
    check_same_dtype([("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)])
    if v.shape != k.shape:
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(
            f"v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}"
        )
    check_size("k_cache", k_cache, 2, k.shape[1], "k.shape[1], the number of kv heads")
    check_size("k_cache", k_cache, 3, k.shape[2], "k.shape[2], the head dim")
    check_size("slot_mapping", slot_mapping, 0, k.shape[0], "k.shape[0], the number of tokens")
    check_same_device(
        [("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache), ("slot_mapping", slot_mapping)]
    )


def reshape_and_cache_reference(
    k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> None:
    """k, v: [T, Hkv, D]; k_cache, v_cache: [num_blocks, block_size, Hkv, D]; slot_mapping: [T]."""
    _check_args(k, v, k_cache, v_cache, slot_mapping)
    block_size = k_cache.shape[1]
    index = (slot_mapping // block_size, slot_mapping % block_size)  # ([T], [T])
    k_cache.index_put_(index, k)
    v_cache.index_put_(index, v)


def reshape_and_cache_cpu(
    k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> None:
    """The hand-written CPU copy (kernels/csrc/cpu_kernels.cpp); same contract as
    reshape_and_cache_reference. RuntimeError when the library is not built (kernels/cpu_ext.py)."""
    _check_args(k, v, k_cache, v_cache, slot_mapping)
    for name, tensor in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_unit_last_stride(name, tensor)
    cpu_ext.require_ops().reshape_and_cache(k, v, k_cache, v_cache, slot_mapping.contiguous())


def reshape_and_cache_triton(
    k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> None:
    """Triton cache write; same contract as reshape_and_cache_reference."""
    _check_args(k, v, k_cache, v_cache, slot_mapping)
    for name, tensor in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_unit_last_stride(name, tensor)
    if v_cache.stride() != k_cache.stride():
        raise ValueError(
            f"v_cache must have k_cache's strides {k_cache.stride()}, got {v_cache.stride()}"
        )
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    kernel = launchable(_reshape_and_cache_kernel, k.device)
    kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        num_kv_heads,
        head_dim,
        k_cache.shape[1],
        BLOCK_H=next_power_of_2(num_kv_heads),
        BLOCK_D=next_power_of_2(head_dim),
        num_warps=4,
    )
