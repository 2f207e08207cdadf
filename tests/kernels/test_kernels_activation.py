"""silu_and_mul: Triton (interpreted) against the torch reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_helpers import assert_close

from kernels.activation import silu_and_mul_reference, silu_and_mul_triton


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens,intermediate", [(1, 16), (4, 300), (3, 1500)])
def test_matches_reference(dtype: torch.dtype, num_tokens: int, intermediate: int) -> None:
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(num_tokens, 2 * intermediate, generator=g) * 4).to(dtype)
    out = silu_and_mul_triton(x)
    assert out.shape == (num_tokens, intermediate)
    assert_close(out, silu_and_mul_reference(x))


def test_reference_is_silu_of_gate_times_up() -> None:
    x = torch.randn(3, 8)
    torch.testing.assert_close(silu_and_mul_reference(x), F.silu(x[:, :4]) * x[:, 4:])


def test_strided_rows() -> None:
    x = torch.randn(4, 100)[:, :64]  # row stride 100
    assert_close(silu_and_mul_triton(x), silu_and_mul_reference(x.contiguous()))


@pytest.mark.parametrize("impl", [silu_and_mul_triton, silu_and_mul_reference])
def test_bad_arguments_are_named(impl) -> None:
    with pytest.raises(ValueError, match="x.shape.*even"):
        impl(torch.randn(2, 7))
    with pytest.raises(ValueError, match="x must have 2 dims"):
        impl(torch.randn(8))
    with pytest.raises(TypeError, match="x must be float32 or bfloat16"):
        impl(torch.randn(2, 8).half())
