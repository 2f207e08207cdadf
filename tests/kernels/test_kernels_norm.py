"""RMSNorm and fused add + RMSNorm: Triton (interpreted) against the torch reference."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close

from kernels.norm import (
    fused_add_rms_norm_reference,
    fused_add_rms_norm_triton,
    rms_norm_reference,
    rms_norm_triton,
)

DTYPES = [torch.float32, torch.bfloat16]


def _inputs(num_tokens: int, hidden: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(num_tokens, hidden, generator=g) * 3).to(dtype)
    residual = torch.randn(num_tokens, hidden, generator=g).to(dtype)
    weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype)
    return x, residual, weight


def test_reference_matches_the_llama_formula() -> None:
    x, _, weight = _inputs(4, 64, torch.float32)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
    torch.testing.assert_close(rms_norm_reference(x, weight, 1e-6), expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens,hidden", [(1, 32), (5, 96), (3, 1000)])
def test_rms_norm_matches_reference(dtype: torch.dtype, num_tokens: int, hidden: int) -> None:
    x, _, weight = _inputs(num_tokens, hidden, dtype)
    assert_close(rms_norm_triton(x, weight, 1e-5), rms_norm_reference(x, weight, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_matches_reference_and_leaves_inputs(dtype: torch.dtype) -> None:
    x, residual, weight = _inputs(6, 96, dtype)
    x_before, residual_before = x.clone(), residual.clone()
    out, residual_out = fused_add_rms_norm_triton(x, residual, weight, 1e-6)
    ref_out, ref_residual = fused_add_rms_norm_reference(x, residual, weight, 1e-6)
    assert_close(residual_out, ref_residual)
    assert_close(out, ref_out)
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)
    torch.testing.assert_close(ref_residual, (x.float() + residual.float()).to(dtype))
    torch.testing.assert_close(ref_out, rms_norm_reference(ref_residual, weight, 1e-6))


def test_strided_rows_and_float32_weight_with_bfloat16_activations() -> None:
    x, residual, weight = _inputs(4, 128, torch.bfloat16)
    wide = torch.zeros(4, 200, dtype=torch.bfloat16)
    wide[:, :128] = x
    x_view = wide[:, :128]  # row stride 200
    expected = rms_norm_reference(x, weight.float(), 1e-6)
    assert_close(rms_norm_triton(x_view, weight.float(), 1e-6), expected)
    out, res = fused_add_rms_norm_triton(x_view, residual, weight, 1e-6)
    ref_out, ref_res = fused_add_rms_norm_reference(x, residual, weight, 1e-6)
    assert_close(out, ref_out)
    assert_close(res, ref_res)


@pytest.mark.parametrize("impl", [rms_norm_triton, rms_norm_reference])
@pytest.mark.parametrize(
    "make_args,error,names",
    [
        (lambda x, w: (x.numpy(), w, 1e-6), TypeError, "x"),
        (lambda x, w: (x.half(), w, 1e-6), TypeError, "x"),
        (lambda x, w: (x[0], w, 1e-6), ValueError, "x"),
        (lambda x, w: (x, w[:-1], 1e-6), ValueError, "weight"),
        (lambda x, w: (x, w.double(), 1e-6), TypeError, "weight"),
        (lambda x, w: (x, w, 0.0), ValueError, "eps"),
        (lambda x, w: (x, w.to("meta"), 1e-6), ValueError, "weight"),
    ],
)
def test_bad_arguments_are_named(impl, make_args, error, names) -> None:
    x, _, weight = _inputs(2, 32, torch.float32)
    with pytest.raises(error, match=names):
        impl(*make_args(x, weight))


def test_triton_wrapper_rejects_a_strided_last_dim() -> None:
    x = torch.randn(4, 64)[:, ::2]
    with pytest.raises(ValueError, match="x must have stride 1"):
        rms_norm_triton(x, torch.ones(32), 1e-6)


def test_fused_rejects_mismatched_residual() -> None:
    x, residual, weight = _inputs(2, 32, torch.float32)
    with pytest.raises(ValueError, match="residual"):
        fused_add_rms_norm_triton(x, residual[:1], weight, 1e-6)
    with pytest.raises(TypeError, match="residual"):
        fused_add_rms_norm_reference(x, residual.bfloat16(), weight, 1e-6)
