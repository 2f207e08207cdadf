"""Switchyard's public namespace for plugin authors:

- `switchyard.plugin` — `hookimpl`, the protocol types, the error types, `BackendType`, and
  `PLUGIN_API_VERSION`;
- `switchyard.testing` — the conformance battery (also a pytest plugin: `-p switchyard.testing`).

Switchyard's code lives in top-level packages with generic names (`plugins`, `gateway`). Another
distribution, or a folder of the project that imports a plugin, may hold a package of the same
name earlier on `sys.path`; importing through `switchyard` binds those names to Switchyard's own
packages (found beside this one) first, so `from switchyard.plugin import ...` always means
Switchyard's.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib import metadata
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent

try:
    __version__ = metadata.version("switchyard")
except metadata.PackageNotFoundError:  # run from a source tree that is not installed
    __version__ = "0+unknown"


def bind(name: str) -> None:
    """Make the top-level package `name` Switchyard's own (`<root>/<name>`), whatever else on
    sys.path has that name. Raises ImportError when another package of that name was imported
    already (it cannot be replaced under its users)."""
    own = _ROOT / name / "__init__.py"
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", None) or "").resolve() == own:
            return
        raise ImportError(
            f"the top-level name {name!r} is already taken by {getattr(loaded, '__file__', None) or loaded!r}; "
            f"Switchyard's own package is {own.parent}. Import switchyard before that package, or rename it."
        )
    spec = importlib.util.spec_from_file_location(name, own, submodule_search_locations=[str(own.parent)])
    if spec is None or spec.loader is None:
        raise ImportError(f"Switchyard's package {name!r} is missing: {own}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


bind("plugins")
