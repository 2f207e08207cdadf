"""Types shared by the plugin manager, the configuration and the routing plugins."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from plugins.contract.protocol import Backend


class SharedPart(Protocol):
    """What `BackendType.share` started once for all the worker processes of a server."""

    options: Any  # the options every worker creates the backend with

    def close(self) -> None:
        """Stop it (blocking), after the workers have stopped."""


class BackendType(msgspec.Struct, frozen=True, kw_only=True):
    """A kind of backend a plugin can create: `type = "<name>"` in a `[[backends]]` table."""

    name: str
    options: type[msgspec.Struct]
    create: Callable[[str, Any], Backend]
    description: str = ""
    # For a server with several worker processes: `share(name, options)` starts, once in the
    # server's parent process before the workers, what they all use (the built-in engine's
    # process), or returns None when there is nothing to share. Blocking; a bad option raises
    # `ConfigError`.
    share: Callable[[str, Any], SharedPart | None] | None = None


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
