"""reshape_and_cache: Triton (interpreted) against the torch reference and the spec's formula."""

from __future__ import annotations

import pytest
import torch

from kernels.kv_cache import reshape_and_cache_reference, reshape_and_cache_triton


@pytest.mark.parametrize("impl", [reshape_and_cache_triton, reshape_and_cache_reference])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim,num_kv_heads", [(32, 1), (128, 2), (64, 8)])
def test_writes_each_token_to_its_slot(impl, dtype, head_dim, num_kv_heads) -> None:
    g = torch.Generator().manual_seed(3)
    num_blocks, block_size, num_tokens = 6, 16, 20
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(k_cache.shape, generator=g).to(dtype)
    # k and v as strided views (fused kv projection)
    kv = torch.randn(num_tokens, 2, num_kv_heads, head_dim, generator=g).to(dtype)
    k, v = kv[:, 0], kv[:, 1]
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens]
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    expected_k.view(-1, num_kv_heads, head_dim)[slots] = k
    expected_v.view(-1, num_kv_heads, head_dim)[slots] = v
    assert impl(k, v, k_cache, v_cache, slots) is None
    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("impl", [reshape_and_cache_triton, reshape_and_cache_reference])
def test_head_major_cache_storage(impl) -> None:
    """The engine's caches are views of [Hkv, num_blocks, block_size, D] storage."""
    g = torch.Generator().manual_seed(4)
    num_blocks, block_size, num_kv_heads, head_dim, num_tokens = 6, 16, 3, 32, 20
    storage = torch.randn(2, num_kv_heads, num_blocks, block_size, head_dim, generator=g)
    k_cache, v_cache = storage[0].permute(1, 2, 0, 3), storage[1].permute(1, 2, 0, 3)
    k, v = (torch.randn(num_tokens, num_kv_heads, head_dim, generator=g) for _ in range(2))
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens]
    expected_k, expected_v = k_cache.contiguous(), v_cache.contiguous()
    expected_k.view(-1, num_kv_heads, head_dim)[slots] = k
    expected_v.view(-1, num_kv_heads, head_dim)[slots] = v
    impl(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("impl", [reshape_and_cache_triton, reshape_and_cache_reference])
def test_bad_arguments_are_named(impl) -> None:
    k = torch.randn(3, 2, 16)
    cache = torch.zeros(4, 8, 2, 16)
    slots = torch.tensor([0, 9, 31])
    with pytest.raises(TypeError, match="slot_mapping must be int64"):
        impl(k, k, cache, cache.clone(), slots.int())
    with pytest.raises(ValueError, match="slot_mapping.shape"):
        impl(k, k, cache, cache.clone(), slots[:2])
    with pytest.raises(ValueError, match="k_cache.shape\\[2\\]"):
        impl(k, k, cache[:, :, :1], cache[:, :, :1].clone(), slots)
    with pytest.raises(TypeError, match="k_cache is torch.bfloat16"):
        impl(k, k, cache.bfloat16(), cache.clone(), slots)
    with pytest.raises(ValueError, match="v must have k's shape"):
        impl(k, k[:, :1], cache, cache.clone(), slots)
