"""float32 matrices packed for oneDNN (`builtin_engine.model.packed_linear`): a row's result does not
depend on the rows beside it, it is the float32 product up to summation order, and the op a
compiled graph calls (the Python one, and the C++ one where the kernels are built) gives the eager
result, until its matrix is freed. The token-level check is
tests/builtin_engine/test_hf_parity.py."""

from __future__ import annotations

import gc

import pytest
import torch

from builtin_engine.model import packed_linear
from kernels import cpu_ext

pytestmark = pytest.mark.skipif(not packed_linear.can_pack(torch.zeros(1, 1)),
                                reason="float32 matrices are not packed on this CPU")


@pytest.mark.parametrize("in_features", [576, 1536])  # 1536: the one-row kernel sums in another order
def test_a_rows_result_does_not_depend_on_its_batch(in_features: int) -> None:
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(96, in_features, generator=g) * 0.05
    bias = torch.randn(96, generator=g)
    matrix = packed_linear.pack(weight)
    rows = torch.randn(40, in_features, generator=g)
    alone = torch.cat([packed_linear.linear(rows[i:i + 1], matrix, bias) for i in range(len(rows))])
    for count in (2, 3, 7, 33, 40):
        assert torch.equal(packed_linear.linear(rows[:count], matrix, bias), alone[:count])
    torch.testing.assert_close(alone, torch.nn.functional.linear(rows, weight, bias), rtol=1e-5, atol=1e-5)


def test_the_compiled_graphs_op_gives_the_eager_result() -> None:
    weight, x = torch.randn(48, 32), torch.randn(5, 32)
    matrix = packed_linear.pack(weight)
    out = torch.ops.switchyard.packed_linear(x, matrix.handle, matrix.out_features, None)
    assert out.dtype == torch.float32 and torch.equal(out, packed_linear.linear(x, matrix))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpp_op_gives_the_python_ops_result_until_the_matrix_goes(dtype: torch.dtype) -> None:
    if cpu_ext.ops() is None:
        pytest.skip("the C++ kernels are not built")
    if dtype == torch.bfloat16 and not packed_linear.can_pack(torch.zeros(1, 1, dtype=dtype)):
        pytest.skip("no oneDNN bfloat16 kernels on this CPU")
    weight, bias, x = torch.randn(48, 32, dtype=dtype), torch.randn(48, dtype=dtype), torch.randn(5, 32, dtype=dtype)
    matrix = packed_linear.pack(weight)
    assert matrix.native
    out = torch.ops.switchyard_cpu.packed_linear(x, matrix.handle, matrix.out_features, bias)
    assert out.dtype == dtype and torch.equal(out, torch.ops.switchyard.packed_linear(x, matrix.handle, 48, bias))
    handle = matrix.handle
    del matrix
    gc.collect()
    with pytest.raises(RuntimeError, match="is gone"):
        torch.ops.switchyard_cpu.packed_linear(x, handle, 48, None)
    with pytest.raises(RuntimeError, match="is gone"):
        torch.ops.switchyard.packed_linear(x, handle, 48, None)


def test_the_float32_engine_packs_its_projections_and_lm_head(make_engine) -> None:  # noqa: ANN001
    weights = make_engine().runner.model.weights
    layer = weights.layers[0]
    matrices = [layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj, weights.lm_head]
    assert all(isinstance(m, packed_linear.PackedMatrix) and m.dtype == torch.float32 for m in matrices)
    assert weights.embed_tokens.dtype == torch.float32 and weights.embed_tokens.layout == torch.strided
