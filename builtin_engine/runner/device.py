"""Where the engine runs and how: the `device`, `dtype` and `compile` settings resolved against
what this machine has, once, before anything is loaded.

- device: "auto" takes the first CUDA device when torch sees one, else the CPU; "cuda" / "cuda:N"
  without such a device is an error that says what torch sees.
- dtype: "auto" is bfloat16 on CUDA and float32 on the CPU (token-exact against transformers).
- compile: whether the decode step runs as a prepared graph. On the CPU, torch.compile (inductor's
  C++ code generation; needs a C++ compiler); on CUDA, CUDA graphs over the Triton kernels (needs
  triton). Default: on for bfloat16 on the CPU and on CUDA, off for float32 on the CPU: the
  reference path starts in seconds rather than compiling (about a minute per machine and
  configuration, ~10 s at each later start) for a ~10% faster decode; compiled, its tokens stay
  transformers' (tests/builtin_engine/test_hf_parity.py runs both).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from typing import Literal

import torch

DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]+)?)$"
DType = Literal["float32", "bfloat16"]


class DeviceError(ValueError):
    """A device, dtype or compile setting this machine cannot serve; the message names it."""


@dataclass(frozen=True, slots=True)
class Placement:
    device: torch.device
    dtype: DType
    compile: bool

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def describe(self) -> str:
        """E.g. "cpu (AMD EPYC), bfloat16, decode step compiled (inductor)"."""
        if self.device.type == "cuda":
            where = f"{self.device} ({torch.cuda.get_device_name(self.device)})"
            how = "decode step in CUDA graphs" if self.compile else "eager"
        else:
            where = f"cpu ({cpu_name()})"
            how = "decode step compiled (inductor)" if self.compile else "eager"
        return f"{where}, {self.dtype}, {how}"


def resolve_placement(device: str = "auto", dtype: str = "auto", compile: bool | None = None) -> Placement:
    """Raises DeviceError naming the setting this machine cannot serve."""
    resolved = resolve_device(device)
    on_cuda = resolved.type == "cuda"
    if dtype not in ("auto", "float32", "bfloat16"):
        raise DeviceError(f"dtype: expected auto, float32 or bfloat16, got {dtype!r}")
    chosen: DType = ("bfloat16" if on_cuda else "float32") if dtype == "auto" else dtype  # type: ignore[assignment]
    missing = _compile_needs(resolved)
    if compile is None:
        compile = missing is None and (on_cuda or chosen == "bfloat16")
    elif compile and missing is not None:
        raise DeviceError(f"compile = true on {resolved.type} needs {missing}")
    return Placement(device=resolved, dtype=chosen, compile=compile)


def resolve_device(device: str) -> torch.device:
    if not isinstance(device, str) or not re.match(DEVICE_PATTERN, device):
        raise DeviceError(f"device: expected auto, cpu, cuda or cuda:N, got {device!r}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "auto":
        return torch.device("cuda", 0) if count else torch.device("cpu")
    if device == "cpu":
        return torch.device("cpu")
    index = int(device.partition(":")[2] or 0)
    if count == 0:
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise DeviceError(
            f"device = {device!r}: torch sees no CUDA device (torch {torch.__version__}, {build}); use "
            f"device = \"auto\" or \"cpu\", or on a machine with an NVIDIA GPU install a CUDA build of torch "
            f"(`make run` does; see README, \"The built-in engine\")")
    if index >= count:
        raise DeviceError(f"device = {device!r}: torch sees {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", index)


def _compile_needs(device: torch.device) -> str | None:
    """What compiling the steps on `device` needs and this machine lacks, or None."""
    if device.type == "cuda":
        from kernels._launch import has_triton

        return None if has_triton() else "triton (the CUDA graphs capture the Triton kernels)"
    if not (os.environ.get("CXX") or any(shutil.which(name) for name in ("g++", "c++", "clang++"))):
        return "a C++ compiler (torch.compile's inductor generates C++), and none was found"
    import kernels

    if not kernels.has_cpu_kernels():  # the reference attention reads lengths back: it cannot be in a graph
        return ("the C++ CPU kernels (the compiled step calls them; `python -m kernels.cpu_build` builds them, "
                "and SWITCHYARD_KERNELS=torch or SWITCHYARD_CPU_KERNELS=0 turn them off)")
    return None


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()
