"""Projection and lm_head matrices packed once for oneDNN, and the matmul over them, eager or
inside a torch.compile'd graph.

bfloat16: `F.linear` on a bfloat16 CPU matrix goes through oneDNN but reorders the weights into
its blocked layout on every call; packed once (AMX tiles where the CPU has them, AVX-512 BF16
otherwise) the projections ran ~1.7x faster at 32 rows, with bit-identical results.
float32: `F.linear` takes aten's BLAS GEMM (MKL's sgemm in this build), which on the 2-core AMD
EPYC Zen 4 here reaches 135-145 GFLOP/s at 32 rows (the lm_head 79, one row 6-27); oneDNN's
AVX-512 kernels on a packed matrix reach 175-215 (one row, multiplied as two: 1.0-2.2x faster),
so float32 matrices are packed on x86 CPUs with AVX2 or AVX-512. The results differ from sgemm's
in the last bits (summation order), as sgemm's own do between batch sizes; the float32 path stays
token-exact against transformers (tests/builtin_engine/test_hf_parity.py).

A packed matrix is an opaque MKLDNN tensor, which torch.compile cannot take as a graph input, so
a compiled graph calls the op `switchyard::packed_linear(x, handle, out_features)` instead:
`handle` (an int, a constant of the graph) names the matrix in this module's table, from which it
goes with its PackedMatrix (the model owns that). Inductor keeps the op as an opaque call, so every
graph shares the one packed copy. Where the C++ kernels are built, the matrix is also in their
table and the graph calls `switchyard_cpu::packed_linear` (kernels/csrc/packed_linear.cpp)
instead: the same oneDNN call without the Python op's own dispatch (15 against 29 µs a call, small
bf16 matrix, one thread), which between a step's 121 GEMMs lets the second OpenMP thread fall
asleep.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass

import torch

from kernels import cpu_ext

_matrices: dict[int, torch.Tensor] = {}
_handles = itertools.count()


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)
class PackedMatrix:
    """A [out, in] bfloat16 or float32 matrix in oneDNN's layout; `_linear` in llama.py multiplies
    by it."""

    packed: torch.Tensor  # MKLDNN tensor
    handle: int
    out_features: int
    in_features: int
    native: bool  # in the C++ kernels' table too

    @property
    def dtype(self) -> torch.dtype:
        return self.packed.dtype

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)


def can_pack(matrix: torch.Tensor) -> bool:
    if matrix.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if matrix.dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return matrix.dtype == torch.float32 and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def pack(matrix: torch.Tensor) -> PackedMatrix:
    """A CPU matrix [out, in] reordered once into oneDNN's blocked layout (no batch-size hint: in
    float32 here the layout it picks runs as fast at 2, 32 and 256 rows as one packed for that row
    count)."""
    packed = torch.ops.mkldnn._reorder_linear_weight(matrix, None)
    handle = next(_handles)
    native = cpu_ext.ops()
    _matrices[handle] = packed
    if native is not None:
        native.remember_packed(handle, packed)
    result = PackedMatrix(packed, handle, matrix.shape[0], matrix.shape[1], native is not None)
    weakref.finalize(result, _forget, handle, native)
    return result


def _forget(handle: int, native: object) -> None:
    _matrices.pop(handle, None)
    if native is not None:
        native.forget_packed(handle)


def linear(x: torch.Tensor, matrix: PackedMatrix, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, in] @ matrix^T (+ bias, added before the one rounding) -> [T, out], in the matrix's
    dtype.

    A row's result does not depend on how many rows come with it: oneDNN's one-row kernel sums in
    another order than its kernel for two or more rows (bfloat16: a few outputs in a thousand
    differ in their last bit; float32: most of them where the inner dimension is 1,536), so a lone
    row is multiplied as two, which costs about what one does. The compiled decode step never has
    fewer than two rows."""
    if torch.compiler.is_compiling():
        op = torch.ops.switchyard_cpu.packed_linear if matrix.native else torch.ops.switchyard.packed_linear
        return op(x, matrix.handle, matrix.out_features, bias)
    if x.shape[0] == 1:
        return torch.ops.mkldnn._linear_pointwise(x.expand(2, -1).contiguous(), matrix.packed, bias, "none", [],
                                                  "")[:1]
    return torch.ops.mkldnn._linear_pointwise(x, matrix.packed, bias, "none", [], "")


@torch.library.custom_op("switchyard::packed_linear", mutates_args=())
def _packed_linear(x: torch.Tensor, handle: int, out_features: int, bias: torch.Tensor | None) -> torch.Tensor:
    matrix = _matrices.get(handle)
    if matrix is None:
        raise RuntimeError(f"packed matrix {handle} is gone (its model was freed)")
    return torch.ops.mkldnn._linear_pointwise(x, matrix, bias, "none", [], "")


@_packed_linear.register_fake
def _(x: torch.Tensor, handle: int, out_features: int, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((x.shape[0], out_features))
