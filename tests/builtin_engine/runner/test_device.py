"""The `device`, `dtype` and `compile` settings: resolved against this machine (no GPU here), and
each one this machine cannot serve is an error naming it — in the engine, the backend's options,
and `switchyard serve`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import torch

import kernels
from builtin_engine.config import EngineConfig
from builtin_engine.runner.device import DeviceError, resolve_placement
from plugins.builtin.backend import BuiltinOptions

ROOT = Path(__file__).resolve().parents[3]
needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the errors of a machine without a GPU")


def test_auto_picks_the_cpu_and_float32_here() -> None:
    placement = resolve_placement()
    assert placement.device == torch.device("cpu") or torch.cuda.is_available()
    if placement.device.type == "cpu":
        assert (placement.dtype, placement.compile) == ("float32", False)  # token-exact by default


@pytest.mark.skipif(not kernels.has_cpu_kernels(), reason="the C++ CPU kernels are not in use here")
def test_bfloat16_compiles_by_default_on_the_cpu() -> None:
    assert resolve_placement("cpu", "bfloat16").compile is True
    assert resolve_placement("cpu", "bfloat16", False).compile is False
    assert resolve_placement("cpu", "float32", True).compile is True
    assert "bfloat16, decode step compiled (inductor)" in resolve_placement("cpu", "bfloat16").describe()


@needs_no_gpu
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
def test_cuda_without_a_gpu_is_an_error_naming_the_option(device: str) -> None:
    with pytest.raises(DeviceError, match=rf"device = '{device}': torch sees no CUDA device"):
        resolve_placement(device)


@pytest.mark.parametrize("device", ["gpu", "cuda:", "CPU", "cuda:x"])
def test_malformed_devices_are_refused(device: str) -> None:
    with pytest.raises(DeviceError, match="device: expected auto, cpu, cuda or cuda:N"):
        resolve_placement(device)
    with pytest.raises(msgspec.ValidationError, match="device"):
        msgspec.convert({"device": device}, BuiltinOptions)


def test_compile_without_a_compiler_is_an_error(monkeypatch) -> None:  # noqa: ANN001
    from builtin_engine.runner import device

    monkeypatch.setattr(device.shutil, "which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(DeviceError, match="compile = true on cpu needs a C\\+\\+ compiler"):
        resolve_placement("cpu", "bfloat16", True)
    assert resolve_placement("cpu", "bfloat16").compile is False  # the default steps back


def test_compile_without_the_cpu_kernels_is_an_error(monkeypatch) -> None:  # noqa: ANN001
    """Without the C++ kernels the attention is the torch reference, which reads the lengths back
    to size its work: it cannot be traced into a graph, so compiling is refused at start-up (and
    the default runs eagerly) instead of failing in the warm-up's trace."""
    monkeypatch.setenv(kernels.BACKEND_ENV, "torch")
    kernels.reset_backend()
    try:
        with pytest.raises(DeviceError, match="compile = true on cpu needs the C\\+\\+ CPU kernels"):
            resolve_placement("cpu", "bfloat16", True)
        assert resolve_placement("cpu", "bfloat16").compile is False
    finally:
        monkeypatch.undo()
        kernels.reset_backend()


def test_prefill_budget_defaults_to_the_device() -> None:
    assert (EngineConfig().batched_tokens_on("cpu"), EngineConfig().batched_tokens_on("cuda")) == (256, 8192)
    assert EngineConfig(max_num_batched_tokens=64).batched_tokens_on("cuda") == 64
    with pytest.raises(ValueError, match="max_num_batched_tokens must be at least 1"):
        EngineConfig(max_num_batched_tokens=0)
    assert msgspec.convert({}, BuiltinOptions).max_num_batched_tokens is None
    with pytest.raises(msgspec.ValidationError, match="max_num_batched_tokens"):
        msgspec.convert({"max_num_batched_tokens": 0}, BuiltinOptions)


def test_kernel_warm_up_leaves_no_trace(make_engine) -> None:  # noqa: ANN001
    """What CUDA engines run before serving: afterwards no request, cached block or step is left,
    and a request gives the tokens a fresh engine gives."""
    from builtin_engine.scheduling.sampling_params import SamplingParams

    def tokens(engine) -> list[int]:  # noqa: ANN001
        handle = engine.add_request(list(range(5, 45)), SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
        engine.run_until_done()
        ids: list[int] = []
        while not handle.finished:
            for choice in handle.get(timeout=10).choices:
                ids.extend(choice.token_ids)
        return ids

    fresh, warmed = make_engine(block_size=8), make_engine(block_size=8)
    warmed.warm_up_kernels()
    assert (warmed.num_steps, warmed.runner.num_graph_steps, warmed.num_unfinished_requests) == (0, 0, 0)
    assert warmed.block_manager.num_free_blocks == fresh.block_manager.num_free_blocks
    assert not warmed.block_manager._cached
    assert tokens(warmed) == tokens(fresh)


@needs_no_gpu
def test_engine_refuses_before_loading(tiny_model_dir) -> None:  # noqa: ANN001
    from builtin_engine.engine import LLMEngine

    with pytest.raises(DeviceError, match="device = 'cuda'"):
        LLMEngine.from_model_dir(tiny_model_dir, config=EngineConfig(device="cuda"))
    with pytest.raises(ValueError, match="matmul_dtype float32 needs dtype float32"):
        LLMEngine.from_model_dir(tiny_model_dir, config=EngineConfig(dtype="bfloat16", matmul_dtype="float32"))


@needs_no_gpu
def test_backend_options_refuse_cuda_here() -> None:
    with pytest.raises(msgspec.ValidationError, match="device = 'cuda': torch sees no CUDA device"):
        msgspec.convert({"device": "cuda"}, BuiltinOptions)
    assert msgspec.convert({"device": "cpu", "dtype": "bfloat16", "compile": False}, BuiltinOptions).compile is False


@needs_no_gpu
def test_serve_stops_with_a_message_naming_the_option(tmp_path: Path) -> None:
    config = tmp_path / "plugins.toml"
    config.write_text('[[backends]]\nname = "builtin"\ntype = "builtin"\n[backends.options]\ndevice = "cuda"\n')
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "device = 'cuda': torch sees no CUDA device" in done.stderr
    assert "backends[0].options" in done.stderr and "Traceback" not in done.stderr
