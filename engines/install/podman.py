"""Podman for the image tests: Debian's podman, runc and mmdebstrap (apt-get), and the images made
from Debian's packages that the tests build on, since no container registry is reachable here:
mmdebstrap writes a root filesystem (about 1.5 min, once), `podman import` makes it an image.
Under the engines' root:

    python-base-<key>/rootfs.tar               Debian bookworm + python3.11 (mmdebstrap), imported into
                                               podman as localhost/switchyard-python-base:<key>
    bookworm-redis7-r1/rootfs.tar              Debian's redis-server 7, as localhost/switchyard-test-redis

Each with its switchyard-engine.json; the tar stays, and is imported again whenever podman's
storage lacks the image.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass

from engines.install.common import MARKER, engines_root, lock, run, say, sha256, write_marker
from engines.install.debian import debian_binary, install_debian_packages

# Debian 12: podman 4.3 with runc 1.1 (Debian's podman prefers crun when both are installed; only
# runc is installed), mmdebstrap for the base image; uidmap, slirp4netns and fuse-overlayfs are
# what rootless podman needs, catatonit its --init
PODMAN_PACKAGES = ("podman", "runc", "mmdebstrap", "uidmap", "slirp4netns", "fuse-overlayfs", "catatonit")

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
            install_debian_packages(name, PODMAN_PACKAGES)
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
