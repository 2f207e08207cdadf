"""Servers from Debian's packages, by apt-get as root: redis-server 7 (what the per-key limit
tests share state through), nginx-light (the gateway benchmarks' floor), and the package lists
other steps need (podman's). Nothing is cached: a binary on PATH, or in /usr/sbin, counts as
installed. `apt-get update` runs only when the package lists do not know the package yet.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from engines.install.common import EngineInstallError, lock, run, say

REDIS_PACKAGE = "redis-server"  # Debian 12: 7.0.x
NGINX_PACKAGE = "nginx-light"  # Debian 12: 1.22.x


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


def install_debian_packages(name: str, packages: tuple[str, ...]) -> None:
    """`apt-get install packages` (as root) for a step whose `name` is missing; the lock is named
    after the first package."""
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
