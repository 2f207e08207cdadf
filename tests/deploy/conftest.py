"""Fixtures of the image tests: Debian's podman (installed by `make engines`), the Python base made
from Debian's packages (`python -m engines.install podman`), and the image built from
deploy/Containerfile on it — once per tree: its tag hashes every input, so an unchanged tree
reuses the image and the build is a no-op.

They skip only where this machine cannot run containers at all, with podman's own words."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy import image as deploy_image
from deploy.podman import cannot_run_containers, podman
from engines import install
from engines.launch import ServerProcess, start_llamacpp

RESULTS = install.cache_root() / "image" / "test-results.json"


@pytest.fixture(scope="session")
def podman_base() -> str:
    if not install.podman_installed():
        pytest.skip("podman is not installed; run `python -m engines.install podman` (part of `make engines`)")
    base = install.install_podman()  # quick once made: the rootfs is cached, `podman import` if podman lost it
    reason = cannot_run_containers(base)
    if reason:
        pytest.skip(reason)
    return base


@pytest.fixture(scope="session", autouse=True)
def _prune_untagged_images() -> Iterator[None]:
    """Builds (the failing ones of test_image too) leave untagged stage images: pruned at the end."""
    yield
    if install.podman_installed():
        podman("image", "prune", "--force", check=False)


@pytest.fixture(scope="session")
def built_image(podman_base: str) -> dict:
    """The image with the default model (CPU torch), built on the local Python base."""
    started = time.monotonic()
    info = deploy_image.build(deploy_image.BuildSpec(engine="podman", base=podman_base))
    return {**info, "fixture_seconds": round(time.monotonic() - started, 1)}


@pytest.fixture(scope="session")
def image(built_image: dict) -> str:
    return built_image["tag"]


@pytest.fixture(scope="session")
def proxy_image(podman_base: str) -> str:
    """The proxy-only image (WITH_MODEL=0): no model, the default config fronts a vLLM fleet."""
    return deploy_image.build(deploy_image.BuildSpec(engine="podman", base=podman_base, with_model=False))["tag"]


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory) -> Iterator[ServerProcess]:
    """llama.cpp's llama-server on the host, serving the default model's GGUF on loopback."""
    if not install.llamacpp_installed():
        pytest.skip("llama.cpp is not installed; run `python -m engines.install llamacpp`")
    server = start_llamacpp(alias="smollm2-135m-instruct", ctx_size=4096, parallel=16, threads=2,
                            log_dir=tmp_path_factory.mktemp("llama"))
    try:
        yield server
    finally:
        server.stop()


def record(key: str, value: object) -> None:
    """Keep a measured figure (image size, cold start, rollout counts) in the image cache's
    test-results.json, for the README and the report."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    if isinstance(value, dict) and isinstance(data.get(key), dict):
        value = {**data[key], **value}  # (several tests add to one figure)
    data[key] = value
    RESULTS.write_text(json.dumps(data, indent=2) + "\n")


def write_config(directory: Path, text: str) -> Path:
    path = directory / "plugins.toml"
    path.write_text(text)
    return path
