"""Plugin layer: the contract (`contract/`), the plugin manager, and the backend and routing
plugins behind it."""

from plugins.contract.hookspecs import hookimpl

__all__ = ["hookimpl"]
