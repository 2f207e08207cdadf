"""Rotary embedding and its cos/sin table: Triton (interpreted) against the torch reference."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close

from kernels.rope import make_cos_sin_cache, rotary_reference, rotary_triton


def _hf_rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Hugging Face Llama's apply_rotary_pos_emb for x: [T, H, D], in float64."""
    head_dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = positions.double()[:, None] * inv_freq[None, :]  # [T, D/2]
    emb = torch.cat([angles, angles], dim=-1)[:, None, :]  # [T, 1, D]
    x1, x2 = x.double().chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x.double() * emb.cos() + rotated * emb.sin()


def test_cos_sin_cache_layout() -> None:
    cache = make_cos_sin_cache(50, 8, 10000.0)
    assert cache.shape == (50, 8) and cache.dtype == torch.float32
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 8, 2).double() / 8))
    angles = torch.arange(50).double()[:, None] * inv_freq
    expected = torch.cat([angles.cos(), angles.sin()], -1)
    torch.testing.assert_close(cache.double(), expected, atol=1e-5, rtol=0)


def test_cos_sin_cache_takes_scaled_inv_freq() -> None:
    inv_freq = torch.tensor([1.0, 0.5, 0.25, 0.125])
    cache = make_cos_sin_cache(10, 8, 10000.0, inv_freq=inv_freq)
    angles = torch.arange(10).float()[:, None] * inv_freq
    torch.testing.assert_close(cache, torch.cat([angles.cos(), angles.sin()], -1))
    with pytest.raises(ValueError, match="inv_freq"):
        make_cos_sin_cache(10, 8, 10000.0, inv_freq=torch.ones(3))


def test_reference_matches_hugging_face_llama() -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(5, 4, 64, generator=g)
    k = torch.randn(5, 2, 64, generator=g)
    positions = torch.tensor([0, 1, 7, 300, 1999])
    expected_q, expected_k = _hf_rotate(q, positions, 10000.0), _hf_rotate(k, positions, 10000.0)
    rotary_reference(q, k, positions, make_cos_sin_cache(2048, 64, 10000.0))
    torch.testing.assert_close(q.double(), expected_q, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(k.double(), expected_k, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim,num_q_heads,num_kv_heads", [(32, 2, 2), (64, 8, 2), (128, 8, 1)])
def test_matches_reference(dtype: torch.dtype, head_dim: int, num_q_heads: int, num_kv_heads: int) -> None:
    g = torch.Generator().manual_seed(2)
    num_tokens = 5
    # q and k as views into one fused qkv projection: strided, not contiguous
    qkv = torch.randn(num_tokens, (num_q_heads + 2 * num_kv_heads) * head_dim, generator=g).to(dtype)
    q = qkv[:, : num_q_heads * head_dim].view(num_tokens, num_q_heads, head_dim)
    k = qkv[:, num_q_heads * head_dim : (num_q_heads + num_kv_heads) * head_dim].view(
        num_tokens, num_kv_heads, head_dim
    )
    v_before = qkv[:, (num_q_heads + num_kv_heads) * head_dim :].clone()
    positions = torch.tensor([3, 0, 511, 17, 3])
    cache = make_cos_sin_cache(512, head_dim, 500000.0)
    q_ref, k_ref = q.clone(), k.clone()
    rotary_reference(q_ref, k_ref, positions, cache)
    assert rotary_triton(q, k, positions, cache) is None
    assert_close(q, q_ref, "cancelling")
    assert_close(k, k_ref, "cancelling")
    assert torch.equal(qkv[:, (num_q_heads + num_kv_heads) * head_dim :], v_before)


@pytest.mark.parametrize("impl", [rotary_triton, rotary_reference])
def test_bad_arguments_are_named(impl) -> None:
    q, k = torch.randn(3, 4, 16), torch.randn(3, 2, 16)
    cache = make_cos_sin_cache(8, 16, 10000.0)
    positions = torch.tensor([0, 1, 2])
    with pytest.raises(TypeError, match="positions must be int64"):
        impl(q, k, positions.int(), cache)
    with pytest.raises(ValueError, match="positions.shape"):
        impl(q, k, positions[:2], cache)
    with pytest.raises(ValueError, match="k.shape\\[2\\]"):
        impl(q, k[..., :8], positions, cache)
    with pytest.raises(TypeError, match="cos_sin_cache must be float32"):
        impl(q, k, positions, cache.bfloat16())
    with pytest.raises(ValueError, match="cos_sin_cache.shape\\[1\\]"):
        impl(q, k, positions, cache[:, :8])
    with pytest.raises(TypeError, match="k is torch.bfloat16 but q is torch.float32"):
        impl(q, k.bfloat16(), positions, cache)
