"""Types shared by the plugin manager, the configuration and the routing plugins."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from plugins.protocol import Backend


class BackendType(msgspec.Struct, frozen=True, kw_only=True):
    """A kind of backend a plugin can create: `type = "<name>"` in a `[[backends]]` table."""

    name: str
    options: type[msgspec.Struct]
    create: Callable[[str, Any], Backend]
    description: str = ""


class Target(msgspec.Struct, frozen=True, kw_only=True):
    """One arm of a route: a backend, the model name that backend knows, and a weight."""

    backend: str
    model: str
    weight: float = 1.0


class Route(msgspec.Struct, frozen=True, kw_only=True):
    """A client-facing model name and how requests for it pick a target."""

    name: str
    targets: tuple[Target, ...]
    strategy: str = "weighted"
    options: dict[str, Any] = {}
