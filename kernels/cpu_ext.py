"""The hand-written CPU kernels (`kernels/csrc/cpu_kernels.cpp`): built once per machine, loaded
on first use, with the torch references as the fallback.

    python -m kernels.cpu_ext build     # what `make setup` runs; quick when already built
    python -m kernels.cpu_ext status

The library is compiled with the system's C++ compiler against the installed torch, for this CPU
(`-march=native`), into `$SWITCHYARD_CACHE` (default `~/.cache/switchyard`)`/kernels/`, in a
directory keyed by the source, torch's version, the compiler and the CPU's model and flags: a
cache shared by different processors, or a torch upgrade, builds a new one. Nothing is compiled
at run time: without a built library (no compiler on the machine, or `SWITCHYARD_CPU_KERNELS=0`)
`ops()` is None and the dispatch in `kernels/__init__.py` uses the torch references.

The ops, `torch.ops.switchyard_cpu.*`, have the references' signatures (`paged_attention_decode`
in decode_attention.py, `paged_attention_prefill` in prefill_attention.py, `reshape_and_cache` in
kv_cache.py) and fake (meta) implementations, so
torch.compile traces through them as opaque calls.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import torch

SOURCE = Path(__file__).resolve().parent / "csrc" / "cpu_kernels.cpp"
LIBRARY_NAME = "switchyard_cpu.so"
DISABLE_ENV = "SWITCHYARD_CPU_KERNELS"  # "0": never load the library (use the references)
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-std=c++17", "-shared", "-fPIC", "-DNDEBUG"]


def _cache_root() -> Path:
    env = os.environ.get("SWITCHYARD_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "switchyard"


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


def _cpu_identity() -> str:
    """The CPU's model name and feature flags (what -march=native compiles for)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = [line for line in text.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(wanted)))


def build_dir(compiler: str | None = None) -> Path:
    compiler = compiler or _compiler() or "none"
    key = hashlib.sha256("\n".join([SOURCE.read_text(), torch.__version__, compiler, " ".join(FLAGS),
                                    _cpu_identity(), sys.version]).encode()).hexdigest()[:16]
    return _cache_root() / "kernels" / f"cpu-torch{torch.__version__.replace('+', '-')}-{key}"


def _build_command(compiler: str, out: Path) -> list[str]:
    from torch.utils import cpp_extension

    torch_lib = Path(torch.__file__).parent / "lib"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    includes = [f"-I{p}" for p in [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]]
    return [compiler, *FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *includes, str(SOURCE), "-o", str(out),
            f"-L{torch_lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{torch_lib}"]


def build(*, quiet: bool = False) -> Path | None:
    """Compile the library unless already built for this source, torch, compiler and CPU; its
    path, or None when there is no C++ compiler (the references serve then)."""
    compiler = _compiler()
    if compiler is None:
        if not quiet:
            print("kernels.cpu_ext: no C++ compiler found; the engine uses the torch references on CPU")
        return None
    target = build_dir(compiler) / LIBRARY_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            partial = target.with_suffix(".partial.so")
            command = _build_command(compiler, partial)
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"building {SOURCE.name} failed:\n{' '.join(command)}\n{done.stderr[-4000:]}")
            partial.rename(target)
    if not quiet:
        print(f"kernels.cpu_ext: {target}")
    return target


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
    compiler = _compiler()
    library = build_dir(compiler) / LIBRARY_NAME if compiler else None
    if library is None or not library.exists():
        return None
    torch.ops.load_library(str(library))
    _register_fakes()
    return torch.ops.switchyard_cpu


def require_ops() -> Any:
    """`ops()`, or RuntimeError saying how to build the library. Plain global reads once loaded,
    so torch.compile traces through it."""
    loaded = _loaded if _tried else ops()
    if loaded is None:
        raise RuntimeError(f"the CPU kernels are not built for this machine (run `python -m kernels.cpu_ext build`), "
                           f"or {DISABLE_ENV}=0 turned them off")
    return loaded


def _register_fakes() -> None:
    @torch.library.register_fake("switchyard_cpu::paged_attention_decode")
    def _decode_fake(q, k_cache, v_cache, block_tables, seq_lens, scale):  # noqa: ANN001, ANN202
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    @torch.library.register_fake("switchyard_cpu::paged_attention_prefill")
    def _prefill_fake(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale):  # noqa: ANN001, ANN202
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    @torch.library.register_fake("switchyard_cpu::reshape_and_cache")
    def _cache_fake(k, v, k_cache, v_cache, slot_mapping):  # noqa: ANN001, ANN202
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.cpu_ext", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("build", "status"))
    args = parser.parse_args(argv)
    if args.command == "build":
        build()
        return 0
    library = build_dir() / LIBRARY_NAME
    print(f"{library}: {'built' if library.exists() else 'not built'}; loaded: {ops() is not None}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
