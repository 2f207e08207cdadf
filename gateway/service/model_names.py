"""Which route a client's model name goes to, so agents need no renaming (Claude Code's
`ANTHROPIC_DEFAULT_*_MODEL`, Codex's `model`): a route's own name (or a model served under its own
name) first, then a route's exact `aliases`, then the first glob that matches — a route whose name
is a glob (`name = "claude-*"`) or a glob among its aliases — in the order the routes are declared.

Globs are `fnmatch`'s, case-sensitive: `*`, `?`, `[seq]`. A client may send any name, so what the
globs decide is remembered for a bounded number of names only.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Container, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.config import RouteConfig

GLOB_CHARS = frozenset("*?[")
_REMEMBERED = 4096  # names whose glob match is kept


def is_glob(name: str) -> bool:
    return not GLOB_CHARS.isdisjoint(name)


def glob_pattern(glob: str) -> re.Pattern[str]:
    return re.compile(fnmatch.translate(glob))


class ModelNames:
    """The aliases and globs of the configured routes (exact route names are the gateway's own)."""

    def __init__(self, routes: Sequence[RouteConfig]) -> None:
        self.aliases: dict[str, str] = {}  # exact alias -> route
        self.globs: list[tuple[re.Pattern[str], str]] = []  # (pattern, route), in declared order
        for route in routes:
            for name in ([route.name] if is_glob(route.name) else []) + list(route.aliases):
                if is_glob(name):
                    self.globs.append((glob_pattern(name), route.name))
                else:
                    self.aliases.setdefault(name, route.name)
        self._matched: dict[str, str | None] = {}

    def route_of(self, model: str, routes: Container[str]) -> str | None:
        """The route `model` names, or None."""
        if model in routes:
            return model
        route = self.aliases.get(model)
        if route is not None or not self.globs:
            return route
        if model in self._matched:
            return self._matched[model]
        route = next((name for pattern, name in self.globs if pattern.fullmatch(model)), None)
        if len(self._matched) >= _REMEMBERED:
            self._matched.clear()
        self._matched[model] = route
        return route
