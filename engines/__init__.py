"""Real inference servers the proxy backends front: installed once per machine, started on demand.

- `engines.install`: `python -m engines.install vllm|llamacpp|gguf|all` builds or installs each
  engine into a cache directory keyed by its pinned version (idempotent, locked, atomic).
- `engines.launch`: start a server on a free loopback port, wait for `/health`, stop it by PID.

Nothing here imports the gateway or the plugins; plugins import `engines.launch` lazily when a
backend's `launch` option asks the plugin to start its own server.
"""
