"""Where torch.compile's inductor keeps the engine's compiled graphs: under the Switchyard cache
root, one directory per torch version, so a graph is compiled once per machine.

Inductor reads `TORCHINDUCTOR_CACHE_DIR` once and, when it is unset, writes its own default (a
directory under /tmp) into the environment; something in the engine's imports reaches that, so
the variable must be set before them: `builtin_engine/__init__.py` calls `default_compile_cache_env`.
A user's own `TORCHINDUCTOR_CACHE_DIR` wins.
"""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

ENV = "TORCHINDUCTOR_CACHE_DIR"


def compile_cache_dir() -> Path:
    """`cache_root()/compile/torch-<version>` (the version as pip has it, `+` made `-`)."""
    from builtin_engine.model.store import cache_root

    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return cache_root() / "compile" / f"torch-{version.replace('+', '-')}"


def default_compile_cache_env() -> None:
    os.environ.setdefault(ENV, str(compile_cache_dir()))
