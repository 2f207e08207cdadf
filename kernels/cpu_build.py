"""Build the hand-written CPU kernels (`kernels/csrc/*.cpp`, one library) once per machine.

    python -m kernels.cpu_build           # what `make setup` runs; quick when already built
    python -m kernels.cpu_build --status

The library is compiled with the system's C++ compiler against the installed torch, for this CPU
(`-march=native`), into `$SWITCHYARD_CACHE` (default `~/.cache/switchyard`)`/kernels/`, in a
directory keyed by the sources, torch's version, the compiler and the CPU's model and flags: a
cache shared by different processors, or a torch upgrade, builds a new one. Without a compiler
nothing is built and the engine uses the torch references (`kernels/cpu_ext.py` loads it).
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

import torch

SOURCES = sorted((Path(__file__).resolve().parent / "csrc").glob("*.cpp"))
LIBRARY_NAME = "switchyard_cpu.so"
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
    key = hashlib.sha256("\n".join([*(s.read_text() for s in SOURCES), torch.__version__, compiler, " ".join(FLAGS),
                                    _cpu_identity(), sys.version]).encode()).hexdigest()[:16]
    return _cache_root() / "kernels" / f"cpu-torch{torch.__version__.replace('+', '-')}-{key}"


def _build_command(compiler: str, out: Path) -> list[str]:
    from torch.utils import cpp_extension

    torch_lib = Path(torch.__file__).parent / "lib"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    includes = [f"-I{p}" for p in [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]]
    return [compiler, *FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *includes, *map(str, SOURCES), "-o", str(out),
            f"-L{torch_lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{torch_lib}"]


def build(*, quiet: bool = False) -> Path | None:
    """Compile the library unless already built for this source, torch, compiler and CPU; its
    path, or None when there is no C++ compiler (the references serve then)."""
    compiler = _compiler()
    if compiler is None:
        if not quiet:
            print("kernels.cpu_build: no C++ compiler found; the engine uses the torch references on CPU")
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
                names = " ".join(s.name for s in SOURCES)
                raise RuntimeError(f"building {names} failed:\n{' '.join(command)}\n{done.stderr[-4000:]}")
            partial.rename(target)
    if not quiet:
        print(f"kernels.cpu_build: {target}")
    return target


def built_library() -> Path | None:
    """The library built for this machine, or None."""
    compiler = _compiler()
    library = build_dir(compiler) / LIBRARY_NAME if compiler else None
    return library if library is not None and library.exists() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.cpu_build", description=__doc__.split("\n\n")[0])
    parser.add_argument("--status", action="store_true", help="say whether it is built; build nothing")
    args = parser.parse_args(argv)
    if args.status:
        print(f"{build_dir() / LIBRARY_NAME}: {'built' if built_library() else 'not built'}")
        return 0
    build()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
