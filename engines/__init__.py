"""Real inference servers the proxy backends front: installed once per machine, started on demand.

- `engines.install`: `python -m engines.install <what>|all|status` builds or installs each engine
  and tool (llama.cpp, vLLM, the GGUF, Redis, nginx, kubectl, podman, the agent CLIs) into a cache
  directory keyed by its pinned version (idempotent, locked, atomic); one module per step.
- `engines.launch`: start a server on a free loopback port, wait for `/health`, stop it by PID.

Nothing here imports the gateway or the plugins; plugins import `engines.launch` lazily when a
backend's `launch` option asks the plugin to start its own server.
"""
