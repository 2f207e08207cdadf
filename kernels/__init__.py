"""The engine's kernels and the one place that picks how each one runs.

Every function here calls either the Triton wrapper or the plain-torch reference of the same
name and signature (each pair lives in one file of this package, beside its kernel). Which one:

- SWITCHYARD_KERNELS=auto (the default): Triton when the first tensor argument is on a CUDA
  device and triton is installed; on the CPU the hand-written C++ kernel where there is one
  (paged attention and the KV cache write, `*_cpu`, built once per machine by
  `python -m kernels.cpu_build`) and it is built, the torch reference otherwise;
- SWITCHYARD_KERNELS=triton: always Triton; CPU tensors then run in Triton's interpreter, which
  needs TRITON_INTERPRET=1 set before triton is first imported (tests do this);
- SWITCHYARD_KERNELS=torch: always the reference.

Every path traces under torch.compile: the Triton and C++ kernels are opaque calls there.

The variable is read once, at the first kernel call, and the choice is kept (reading the
environment on every call cost ~3% of a single-stream decode step); `reset_backend()` forgets
it, so the next call reads the variable again (tests that change it). Importing this package
only imports: triton is optional.
"""

from __future__ import annotations

import os

from torch import Tensor

from kernels import activation, cpu_ext, decode_attention, kv_cache, norm, prefill_attention, rope, sampling
from kernels._launch import has_triton
from kernels.rope import make_cos_sin_cache
from kernels.sampling import sampling_mask

__all__ = [
    "fused_add_rms_norm",
    "has_cpu_kernels",
    "make_cos_sin_cache",
    "paged_attention_decode",
    "paged_attention_prefill",
    "reshape_and_cache",
    "resolve_backend",
    "rms_norm",
    "rotary",
    "sample",
    "sampling_mask",
    "silu_and_mul",
]

BACKEND_ENV = "SWITCHYARD_KERNELS"
_BACKENDS = ("auto", "triton", "torch")


_backend: str | None = None  # the variable's value, validated; None until the first call
_cpu_kernels: bool = False  # whether the C++ CPU kernels serve CPU tensors (read with _backend)


def _read_backend() -> str:
    choice = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if choice not in _BACKENDS:
        raise ValueError(
            f"{BACKEND_ENV}={os.environ[BACKEND_ENV]!r}: expected one of {', '.join(_BACKENDS)}"
        )
    return choice


def reset_backend() -> None:
    """Forget the backend chosen from SWITCHYARD_KERNELS; the next kernel call reads it again."""
    global _backend
    _backend = None


def resolve_backend() -> str:
    """Read SWITCHYARD_KERNELS (and load the CPU kernels) now, not at the first kernel call: the
    engine calls this before torch.compile traces the model, so the trace sees the choice made."""
    global _backend, _cpu_kernels
    if _backend is None:
        _backend = _read_backend()
        _cpu_kernels = _backend == "auto" and cpu_ext.ops() is not None
    return _backend


def _use_triton(tensor: Tensor) -> bool:
    """Whether the call whose first tensor argument is `tensor` goes to the Triton wrapper."""
    choice = _backend if _backend is not None else resolve_backend()
    if choice == "auto":
        return tensor.is_cuda and has_triton()
    return choice == "triton"


def _use_cpu_kernel(tensor: Tensor) -> bool:
    """Whether a call not sent to Triton goes to the C++ CPU kernel (where the op has one)."""
    return _cpu_kernels and tensor.device.type == "cpu"


def has_cpu_kernels() -> bool:
    """Whether CPU tensors get the C++ kernels (built, and SWITCHYARD_KERNELS=auto)."""
    resolve_backend()
    return _cpu_kernels


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x: [T, H], weight: [H] -> [T, H]. See kernels/norm.py."""
    if _use_triton(x):
        return norm.rms_norm_triton(x, weight, eps)
    return norm.rms_norm_reference(x, weight, eps)


def fused_add_rms_norm(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    """x, residual: [T, H], weight: [H] -> (rms_norm(x + residual), x + residual). See norm.py."""
    if _use_triton(x):
        return norm.fused_add_rms_norm_triton(x, residual, weight, eps)
    return norm.fused_add_rms_norm_reference(x, residual, weight, eps)


def rotary(q: Tensor, k: Tensor, positions: Tensor, cos_sin_cache: Tensor) -> None:
    """In place: q: [T, Hq, D], k: [T, Hkv, D], positions: [T] int64, cache: [P, D]. See rope.py."""
    if _use_triton(q):
        return rope.rotary_triton(q, k, positions, cos_sin_cache)
    return rope.rotary_reference(q, k, positions, cos_sin_cache)


def silu_and_mul(x: Tensor) -> Tensor:
    """x: [T, 2 * I] -> silu(x[:, :I]) * x[:, I:], [T, I]. See kernels/activation.py."""
    if _use_triton(x):
        return activation.silu_and_mul_triton(x)
    return activation.silu_and_mul_reference(x)


def reshape_and_cache(
    k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> None:
    """In place: k_cache.view(-1, Hkv, D)[slot_mapping[t]] = k[t], same for v. See kv_cache.py."""
    if _use_triton(k):
        return kv_cache.reshape_and_cache_triton(k, v, k_cache, v_cache, slot_mapping)
    if _use_cpu_kernel(k):
        return kv_cache.reshape_and_cache_cpu(k, v, k_cache, v_cache, slot_mapping)
    return kv_cache.reshape_and_cache_reference(k, v, k_cache, v_cache, slot_mapping)


def paged_attention_decode(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
) -> Tensor:
    """q: [B, Hq, D] -> [B, Hq, D], one query per sequence. See kernels/decode_attention.py."""
    if _use_triton(q):
        return decode_attention.paged_attention_decode_triton(
            q, k_cache, v_cache, block_tables, seq_lens, scale
        )
    if _use_cpu_kernel(q):
        return decode_attention.paged_attention_decode_cpu(q, k_cache, v_cache, block_tables, seq_lens, scale)
    return decode_attention.paged_attention_decode_reference(
        q, k_cache, v_cache, block_tables, seq_lens, scale
    )


def paged_attention_prefill(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    cu_seqlens_q: Tensor,
    seq_lens: Tensor,
    scale: float,
) -> Tensor:
    """q: [T, Hq, D] -> [T, Hq, D], causal over cached context. See prefill_attention.py."""
    if _use_triton(q):
        return prefill_attention.paged_attention_prefill_triton(
            q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale
        )
    if _use_cpu_kernel(q):
        return prefill_attention.paged_attention_prefill_cpu(
            q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale
        )
    return prefill_attention.paged_attention_prefill_reference(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale
    )


def sample(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    min_p: Tensor,
    seeds: Tensor,
    offsets: Tensor,
) -> Tensor:
    """logits: [B, V] float32 -> [B] int64 token ids. See kernels/sampling.py."""
    if _use_triton(logits):
        return sampling.sample_triton(logits, temperature, top_k, top_p, min_p, seeds, offsets)
    return sampling.sample_reference(logits, temperature, top_k, top_p, min_p, seeds, offsets,
                                     cpu_argmax=_use_cpu_kernel(logits))
