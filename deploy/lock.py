"""The image's locked dependencies: `deploy/requirements-<torch>.lock`, every distribution the
project's wheel needs (with the extras the image ships) pinned to one version and one file hash.

    python -m deploy.lock cpu     # torch's CPU build (2.13.0+cpu)
    python -m deploy.lock cuda    # torch's CUDA build from PyPI, with its nvidia-* wheels
    python -m deploy.lock check   # exit 1 when a lock no longer matches pyproject.toml

The resolution is pip's own (`pip install --dry-run --report`), for CPython 3.11 on x86_64
Linux, the image's platform. The CPU build of torch is not on PyPI (PyPI's Linux torch wheels
are CUDA builds): on this project's machines pip finds it on local disk; elsewhere pass
`--extra-index-url https://download.pytorch.org/whl/cpu` (both resolve to the same file). The
CUDA lock is resolved against PyPI alone (`pip --isolated`), metadata only: nothing multi-GB is
downloaded to write it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
EXTRAS = ("redis", "otel")  # `[responses] store = "redis"`, shared limits; OTLP traces
# needed on some of the image's Pythons but not on the one resolving the lock: redis wants
# async-timeout below Python 3.11.3, and Debian bookworm's python3 is 3.11.2
ALSO = ("async-timeout>=4.0.3",)
# Declared by a dependency but never loaded in an image of this variant: left out of its lock.
# name -> (the distribution that declares it, why it is safe to leave out). `pip check` in the
# image build then allows exactly these complaints (deploy/image.py writes them into the context).
OMIT = {
    "cpu": {"triton": ("xgrammar", "xgrammar loads it only for its CUDA bitmask kernel and the built-in "
                                   "engine uses torch references on the CPU; it is 1 GB of the image")},
    "cuda": {},
}
VARIANTS = ("cpu", "cuda")
PYPI = "https://pypi.org/simple"
PROJECT = "switchyard"


def lock_path(variant: str) -> Path:
    return DEPLOY / f"requirements-{variant}.lock"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve(variant: str, *, extra_index_urls: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """Every distribution `.[EXTRAS]` installs, as pip resolves it for this variant: name,
    version, file name and sha256 (the project itself left out)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip"]
        if variant == "cuda":
            cmd += ["--isolated"]  # no local-disk CPU torch, no constraints: PyPI's CUDA build
        cmd += ["install", "--dry-run", "--ignore-installed", "--quiet", "--disable-pip-version-check",
                "--only-binary", ":all:", "--report", str(report)]
        if variant == "cuda":
            cmd += ["--index-url", PYPI]
        for url in extra_index_urls:
            cmd += ["--extra-index-url", url]
        cmd += [f".[{','.join(EXTRAS)}]", *ALSO]
        subprocess.run(cmd, cwd=ROOT, check=True)
        data = json.loads(report.read_text())
    pins = []
    for item in data["install"]:
        meta, info = item["metadata"], item["download_info"]
        if canonical(meta["name"]) == PROJECT:
            continue
        hashes = info.get("archive_info", {}).get("hashes", {})
        if "sha256" not in hashes:
            raise SystemExit(f"pip reported no sha256 for {meta['name']} ({info['url']})")
        pins.append({"name": canonical(meta["name"]), "version": meta["version"],
                     "file": info["url"].rsplit("/", 1)[-1].replace("%2B", "+"), "sha256": hashes["sha256"]})
    pins = [p for p in pins if p["name"] not in OMIT[variant]]
    torch = [p for p in pins if p["name"] == "torch"]
    if not torch:
        raise SystemExit("the resolution has no torch")
    is_cpu = torch[0]["version"].endswith("+cpu")
    if is_cpu != (variant == "cpu"):
        raise SystemExit(f"variant {variant!r} resolved torch {torch[0]['version']} ({torch[0]['file']})")
    return sorted(pins, key=lambda p: p["name"])


def render(variant: str, pins: list[dict[str, str]]) -> str:
    lines = [
        f"# The image's dependencies, torch {variant.upper()} build: `python -m deploy.lock {variant}` writes this",
        f"# file from pyproject.toml with the extras [{','.join(EXTRAS)}]; do not edit by hand. CPython 3.11,",
        "# x86_64 Linux. `pip install --require-hashes --no-deps -r` this file, then the project's wheel.",
    ]
    for name, (declared_by, why) in OMIT[variant].items():
        lines.append(f"# left out: {name}, which {declared_by} declares ({why})")
    for p in pins:
        lines.append(f"{p['name']}=={p['version']} \\")
        lines.append(f"    --hash=sha256:{p['sha256']}  # {p['file']}")
    return "\n".join(lines) + "\n"


def read_lock(variant: str) -> dict[str, str]:
    """name → version of a lock file."""
    pins = {}
    for line in lock_path(variant).read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+) \\$", line)
        if m:
            pins[canonical(m[1])] = m[2]
    return pins


def pip_check_allowed(variant: str) -> list[str]:
    """The lines `pip check` may print in an image of this variant: none broken, or only the
    requirements OMIT leaves out."""
    pins = read_lock(variant)
    return ["No broken requirements found."] + [
        f"{declared_by} {pins[canonical(declared_by)]} requires {name}, which is not installed."
        for name, (declared_by, _) in OMIT[variant].items()]


def pyproject_requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in EXTRAS:
        reqs += [r for r in project["optional-dependencies"][extra] if not r.startswith(PROJECT)]
    return reqs


def mismatches(variant: str) -> list[str]:
    """What pyproject.toml asks for that the lock does not hold (a name missing, or an `==` pin
    at another version): the lock is stale."""
    pins = read_lock(variant)
    problems = []
    for req in pyproject_requirements():
        m = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*(==\s*([^;\s]+))?", req)
        assert m, req
        name, pinned = canonical(m[1]), m[4]
        if name not in pins:
            problems.append(f"{name}: in pyproject.toml, not in {lock_path(variant).name}")
        elif pinned and pins[name].split("+")[0] != pinned:
            problems.append(f"{name}: pyproject.toml pins {pinned}, {lock_path(variant).name} has {pins[name]}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.lock", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=(*VARIANTS, "check"))
    parser.add_argument("--extra-index-url", action="append", default=[],
                        help="also look here (e.g. https://download.pytorch.org/whl/cpu for the CPU torch)")
    args = parser.parse_args(argv)
    if args.what == "check":
        problems = [p for v in VARIANTS for p in mismatches(v)]
        for p in problems:
            print(f"stale lock: {p}", file=sys.stderr)
        return 1 if problems else 0
    pins = resolve(args.what, extra_index_urls=tuple(args.extra_index_url))
    lock_path(args.what).write_text(render(args.what, pins))
    print(f"{lock_path(args.what)}: {len(pins)} distributions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
