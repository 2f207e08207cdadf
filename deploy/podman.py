"""Running Debian's podman on these machines: the settings every podman call of the image tooling
and the image tests gets, and the check whether containers can run here at all.

Rootful podman 4.3 asks the OCI runtime for `RLIMIT_NOFILE` 1048576 in every container and
lowers its own `RLIMIT_NPROC` to 32768 first. Where the caller lacks CAP_SYS_RESOURCE (seen on
these machines: root, but without that capability, with a hard NOFILE of 20000), runc cannot
set either ("error setting rlimits for ready process: ... operation not permitted") and no
container starts, `RUN` steps of a build included. A containers.conf of our own (podman reads
the file named by `CONTAINERS_CONF`) asks for limits this process may grant instead, and pins
the runtime to runc: Debian's podman prefers crun when both are installed, and crun refuses
these machines' hybrid cgroup v1 hierarchy ("cgroups in hybrid mode not supported").
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import subprocess
from pathlib import Path

from engines.install import cache_root

PODMAN_NPROC = 32768  # what podman sets for itself before it starts a container


def podman_binary() -> str | None:
    return shutil.which("podman") or shutil.which("podman", path="/usr/bin:/usr/sbin")


def containers_conf() -> Path:
    """Our containers.conf, written for this process's limits; rewritten when they differ."""
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 1048576)
    nproc_hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nproc = PODMAN_NPROC if nproc_hard == resource.RLIM_INFINITY else min(nproc_hard, PODMAN_NPROC)
    text = ("# written by deploy/podman.py for the image tooling and tests (see its docstring)\n"
            "[containers]\n"
            f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
            "[engine]\n"
            'runtime = "runc"\n')
    path = cache_root() / "podman" / f"containers-{nofile}-{nproc}.conf"
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


def podman_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a podman call: ours, with `CONTAINERS_CONF` set (a caller's own wins)."""
    full = {**os.environ, **(env or {})}
    full.setdefault("CONTAINERS_CONF", str(containers_conf()))
    return full


def podman(*args: str, check: bool = True, capture: bool = True, timeout: float | None = None,
           input: bytes | None = None) -> subprocess.CompletedProcess:
    binary = podman_binary()
    if binary is None:
        raise FileNotFoundError("podman is not installed; run `python -m engines.install podman`")
    return subprocess.run([binary, *args], env=podman_env(), check=check, capture_output=capture, timeout=timeout,
                          input=input)


@functools.cache
def cannot_run_containers(image: str) -> str | None:
    """Why containers of `image` cannot run on this machine (podman's own words), or None when
    `podman run --rm IMAGE true` works."""
    if podman_binary() is None:
        return "podman is not installed (`python -m engines.install podman`)"
    got = podman("run", "--rm", "--network", "none", "--entrypoint", "true", image, check=False, timeout=120)
    if got.returncode != 0:
        return f"`podman run {image} true` failed here: {(got.stderr or got.stdout).decode(errors='replace').strip()}"
    return None
