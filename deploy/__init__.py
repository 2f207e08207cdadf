"""How Switchyard ships: the container image (`Containerfile`, `image.py`, `lock.py`) and the
Kubernetes manifests (`kubernetes/`). Build tooling only: nothing the product imports lives here,
and the wheel does not include it."""
