"""kernels/__init__.py: the exported API, backend choice, and importing without triton."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import kernels
from kernels import activation, decode_attention, kv_cache, norm, prefill_attention, rope, sampling

ROOT = Path(__file__).resolve().parents[2]


def _tiny_calls():
    """(dispatch name, module, triton wrapper name, reference name, args) for each kernel."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 32, generator=g)
    q = torch.randn(3, 4, 16, generator=g)
    k = torch.randn(3, 2, 16, generator=g)
    k_cache = torch.randn(4, 8, 2, 16, generator=g)
    tables = torch.tensor([[2, 0], [1, 3], [3, 1]], dtype=torch.int32)
    seq_lens = torch.tensor([3, 9, 16], dtype=torch.int32)
    logits = torch.randn(2, 50, generator=g)
    lanes = (torch.ones(2), torch.zeros(2, dtype=torch.int32), torch.ones(2), torch.zeros(2))
    ids = torch.arange(2)
    return [
        ("rms_norm", norm, "rms_norm", (x, torch.ones(32), 1e-6)),
        ("fused_add_rms_norm", norm, "fused_add_rms_norm", (x, x, torch.ones(32), 1e-6)),
        ("rotary", rope, "rotary",
         (q, k, torch.tensor([0, 5, 2]), kernels.make_cos_sin_cache(8, 16, 1e4))),
        ("silu_and_mul", activation, "silu_and_mul", (x,)),
        ("reshape_and_cache", kv_cache, "reshape_and_cache",
         (k, k, k_cache.clone(), k_cache.clone(), torch.tensor([0, 9, 31]))),
        ("paged_attention_decode", decode_attention, "paged_attention_decode",
         (q, k_cache, k_cache, tables, seq_lens, 0.25)),
        ("paged_attention_prefill", prefill_attention, "paged_attention_prefill",
         (q, k_cache, k_cache, tables, torch.tensor([0, 1, 2, 3], dtype=torch.int32), seq_lens, 0.25)),
        ("sample", sampling, "sample", (logits, *lanes, ids, ids)),
    ]


CALLS = _tiny_calls()


def test_exports_exactly_the_engine_api() -> None:
    assert sorted(kernels.__all__) == sorted(
        [
            "rms_norm", "fused_add_rms_norm", "rotary", "make_cos_sin_cache", "silu_and_mul",
            "reshape_and_cache", "paged_attention_decode", "paged_attention_prefill", "sample",
            "sampling_mask", "has_cpu_kernels", "resolve_backend",
        ]
    )
    for name in kernels.__all__:
        assert callable(getattr(kernels, name))


def _spy(monkeypatch, module, name):
    calls = []
    original = getattr(module, name)

    def spy(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


WITH_CPU_KERNEL = {"reshape_and_cache", "paged_attention_decode", "paged_attention_prefill"}


@pytest.mark.parametrize("backend,picked", [(None, "auto"), ("auto", "auto"),
                                            ("torch", "reference"), ("triton", "triton")])
@pytest.mark.parametrize("name,module,stem,args", CALLS, ids=[c[0] for c in CALLS])
def test_backend_choice_on_cpu(monkeypatch, backend, picked, name, module, stem, args) -> None:
    """auto: the C++ kernel where an op has one and it is built, else the reference."""
    if picked == "auto":
        picked = "cpu" if name in WITH_CPU_KERNEL and kernels.cpu_ext.ops() is not None else "reference"
    if backend is None:
        monkeypatch.delenv("SWITCHYARD_KERNELS", raising=False)
    else:
        monkeypatch.setenv("SWITCHYARD_KERNELS", backend)
    triton_calls = _spy(monkeypatch, module, f"{stem}_triton")
    reference_calls = _spy(monkeypatch, module, f"{stem}_reference")
    cpu_calls = _spy(monkeypatch, module, f"{stem}_cpu") if name in WITH_CPU_KERNEL else []
    getattr(kernels, name)(*args)
    expected = {"triton": ([f"{stem}_triton"], [], []), "reference": ([], [f"{stem}_reference"], []),
                "cpu": ([], [], [f"{stem}_cpu"])}[picked]
    assert (triton_calls, reference_calls, cpu_calls) == expected


def test_forced_triton_matches_reference_through_the_dispatch(monkeypatch) -> None:
    """Outputs, and the arguments that rotary and reshape_and_cache update in place, agree."""
    results = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv("SWITCHYARD_KERNELS", backend)
        kernels.reset_backend()
        calls = _tiny_calls()
        outputs = [getattr(kernels, name)(*args) for name, _, _, args in calls]
        results[backend] = torch.utils._pytree.tree_leaves((outputs, [c[3] for c in calls]))
    assert len(results["torch"]) == len(results["triton"])
    for ref, out in zip(results["torch"], results["triton"]):
        if isinstance(ref, torch.Tensor):
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_auto_picks_triton_for_cuda_tensors() -> None:
    assert kernels._use_triton(SimpleNamespace(is_cuda=True))
    assert not kernels._use_triton(torch.zeros(1))


def test_backend_choice_is_read_once_until_reset(monkeypatch) -> None:
    monkeypatch.setenv("SWITCHYARD_KERNELS", "torch")
    reference_calls = _spy(monkeypatch, norm, "rms_norm_reference")
    kernels.rms_norm(torch.ones(1, 4), torch.ones(4), 1e-6)
    monkeypatch.setenv("SWITCHYARD_KERNELS", "triton")  # not seen: the choice is kept
    kernels.rms_norm(torch.ones(1, 4), torch.ones(4), 1e-6)
    assert reference_calls == ["rms_norm_reference"] * 2
    kernels.reset_backend()
    triton_calls = _spy(monkeypatch, norm, "rms_norm_triton")
    kernels.rms_norm(torch.ones(1, 4), torch.ones(4), 1e-6)
    assert triton_calls == ["rms_norm_triton"]


def test_unknown_backend_is_rejected(monkeypatch) -> None:
    monkeypatch.setenv("SWITCHYARD_KERNELS", "cuda")
    with pytest.raises(ValueError, match="SWITCHYARD_KERNELS='cuda'"):
        kernels.rms_norm(torch.ones(1, 4), torch.ones(4), 1e-6)


def test_import_and_cpu_path_without_triton() -> None:
    script = """
import sys
sys.modules["triton"] = None  # as if not installed
import torch, kernels
out = kernels.rms_norm(torch.ones(2, 8), torch.ones(8), 1e-6)
assert torch.allclose(out, torch.ones(2, 8), atol=1e-5)
import os
os.environ["SWITCHYARD_KERNELS"] = "triton"
kernels.reset_backend()
try:
    kernels.rms_norm(torch.ones(2, 8), torch.ones(8), 1e-6)
except ModuleNotFoundError as exc:
    assert "triton" in str(exc), exc
else:
    raise AssertionError("forced triton without triton should fail")
print("ok")
"""
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
