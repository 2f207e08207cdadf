"""Plugin layer: hook specifications, the plugin manager, backend and routing plugins."""

import pluggy

hookimpl = pluggy.HookimplMarker("switchyard")

__all__ = ["hookimpl"]
