"""What every install step shares: the cache's roots, its lock, its marker, running a command, the
wheel cache.

The engines' root is `$SWITCHYARD_ENGINES_CACHE`, else `$SWITCHYARD_CACHE/engines`, else
`~/.cache/switchyard/engines`; each step owns a folder under it keyed by the pinned version.

Every step takes a file lock (`.<name>.lock` in its root) and re-checks under it, so concurrent
`make test` runs build once. A step builds in a staging folder and writes `switchyard-engine.json`
(`MARKER`) last: a folder holding the marker is complete, one without it is not.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

MARKER = "switchyard-engine.json"


class EngineInstallError(Exception):
    """An install step failed; the message says which and how to retry."""


def cache_root() -> Path:
    env = os.environ.get("SWITCHYARD_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "switchyard"


def engines_root() -> Path:
    env = os.environ.get("SWITCHYARD_ENGINES_CACHE")
    return Path(env).expanduser() if env else cache_root() / "engines"


def wheel_cache_dir() -> Path:
    """Shared with builtin_engine.model.store: `$SWITCHYARD_WHEEL_CACHE`, else cache_root()/wheels."""
    env = os.environ.get("SWITCHYARD_WHEEL_CACHE")
    return Path(env).expanduser() if env else cache_root() / "wheels"


def say(line: str) -> None:
    print(f"switchyard engines: {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def lock(name: str, root: Path | None = None) -> Iterator[None]:
    root = root or engines_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run(cmd: list[str], *, what: str, cwd: Path | None = None, env: dict[str, str] | None = None,
        log: Path | None = None) -> None:
    """Run `cmd`, its output to `log` (appended) or to our stderr; raise naming `what` on failure."""
    say(f"{what}: {' '.join(cmd)}")
    if log is not None:
        with open(log, "ab") as out:
            result = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
        if result.returncode != 0:
            tail = log.read_bytes()[-3000:].decode("utf-8", "replace")
            raise EngineInstallError(f"{what} failed (exit {result.returncode}); log {log}:\n{tail}")
    else:
        result = subprocess.run(cmd, cwd=cwd, env=env, stdout=sys.stderr, stderr=sys.stderr, check=False)
        if result.returncode != 0:
            raise EngineInstallError(f"{what} failed (exit {result.returncode})")


def write_marker(directory: Path, info: dict[str, object]) -> None:
    info = {**info, "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    tmp = directory / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, directory / MARKER)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_wheel(requirement: str) -> Path:
    """`dist==version`'s wheel from the wheel cache, downloaded there by pip when missing."""
    wheels = wheel_cache_dir()
    wheels.mkdir(parents=True, exist_ok=True)
    dist, _, version = requirement.partition("==")
    prefix = f"{dist.replace('-', '_').lower()}-{version}-"
    for candidate in sorted(wheels.glob(f"{prefix}*.whl")):
        if zipfile.is_zipfile(candidate):
            return candidate
    download = Path(tempfile.mkdtemp(prefix=".tmp-download-", dir=wheels))
    try:
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--no-input",
             "--only-binary", ":all:", requirement, "-d", str(download)], what=f"downloading {requirement}")
        found = sorted(download.glob(f"{prefix}*.whl"))
        if not found:
            raise EngineInstallError(f"pip downloaded no {prefix}*.whl")
        final = wheels / found[0].name
        os.replace(found[0], final)
        return final
    finally:
        shutil.rmtree(download, ignore_errors=True)
