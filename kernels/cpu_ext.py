"""The hand-written CPU kernels (`kernels/csrc/cpu_kernels.cpp`) at run time: loaded on first use
when `kernels/cpu_build.py` has built them for this machine, else None (the dispatch in
`kernels/__init__.py` then uses the torch references). Nothing is compiled at run time.
`SWITCHYARD_CPU_KERNELS=0` never loads them.

The ops, `torch.ops.switchyard_cpu.*`, have the references' signatures (`paged_attention_decode`
in decode_attention.py, `paged_attention_prefill` in prefill_attention.py, `reshape_and_cache` in
kv_cache.py; `packed_linear` that of `builtin_engine.model.packed_linear`'s Python op, over the matrices
that module registers with `remember_packed`; `argmax_rows` torch.argmax's over a float32 matrix's
rows, for the sampler) and fake (meta) implementations, so torch.compile traces them as opaque
calls.
"""

from __future__ import annotations

import os
from typing import Any

import torch

DISABLE_ENV = "SWITCHYARD_CPU_KERNELS"  # "0": never load the library (use the references)

_loaded: Any | None = None  # torch.ops.switchyard_cpu once loaded
_tried = False


def ops() -> Any | None:
    """`torch.ops.switchyard_cpu` once the built library is loaded; None when it is not built
    for this machine or SWITCHYARD_CPU_KERNELS=0. Looks for the library once per process."""
    global _loaded, _tried
    if not _tried:
        _tried = True
        _loaded = _load()
    return _loaded


def _load() -> Any | None:
    if os.environ.get(DISABLE_ENV, "1").strip() == "0":
        return None
    from kernels.cpu_build import built_library  # not at import: `python -m kernels.cpu_build` imports us

    library = built_library()
    if library is None:
        return None
    torch.ops.load_library(str(library))
    _register_fakes()
    return torch.ops.switchyard_cpu


def require_ops() -> Any:
    """`ops()`, or RuntimeError saying how to build the library. Plain global reads once loaded,
    so torch.compile traces through it."""
    loaded = _loaded if _tried else ops()
    if loaded is None:
        raise RuntimeError(f"the CPU kernels are not built for this machine (run `python -m kernels.cpu_build`), "
                           f"or {DISABLE_ENV}=0 turned them off")
    return loaded


def _register_fakes() -> None:
    @torch.library.register_fake("switchyard_cpu::paged_attention_decode")
    def _decode_fake(q, k_cache, v_cache, block_tables, seq_lens, scale):  # noqa: ANN001, ANN202
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    @torch.library.register_fake("switchyard_cpu::paged_attention_prefill")
    def _prefill_fake(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale):  # noqa: ANN001, ANN202
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    @torch.library.register_fake("switchyard_cpu::packed_linear")
    def _linear_fake(x, handle, out_features, bias):  # noqa: ANN001, ANN202
        return x.new_empty((x.shape[0], out_features))

    @torch.library.register_fake("switchyard_cpu::reshape_and_cache")
    def _cache_fake(k, v, k_cache, v_cache, slot_mapping):  # noqa: ANN001, ANN202
        return None
