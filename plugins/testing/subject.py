"""The backend under test: how the battery makes a fresh, unstarted instance of it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from plugins.contract.errors import ConfigError
from plugins.contract.protocol import Backend
from plugins.manager import backend_types, build_plugin_manager


@dataclass
class Subject:
    label: str  # how verdicts name it ("backend `local` (type `builtin`)")
    create: Callable[[], Backend]
    model: str | None = None  # the model to test; default: the first of models()

    @classmethod
    def of_type(cls, type_name: str, options: dict[str, Any] | None = None, *, name: str | None = None,
                model: str | None = None, disable: Iterable[str] = (), modules: Iterable[str] = ()) -> Subject:
        """A backend of a type some loaded plugin provides (built-ins, entry points, `modules`),
        with `options` decoded into its options struct as a `[backends.options]` table is."""
        types = backend_types(build_plugin_manager(disable, modules))
        btype = types.get(type_name)
        if btype is None:
            raise ConfigError(f"no loaded plugin provides the backend type {type_name!r} (known: {', '.join(sorted(types))})")
        try:
            decoded = msgspec.convert(options or {}, btype.options)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"options of backend type {type_name!r}: {exc}") from None
        name = name or type_name
        return cls(label=f"backend `{name}` (type `{type_name}`)", create=lambda: btype.create(name, decoded), model=model)
