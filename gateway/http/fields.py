"""What a wire API does with each top-level field of its request: acted on, accepted and ignored,
or refused with a reason. One table per API (`<api>/fields.py`), over the API's request struct:

- acted on: every field of the struct the table does not list (derived, so a new struct field is
  acted on until the table says otherwise);
- ignored: accepted, changes nothing here (a cache hint for a cache this gateway does not run,
  a beta feature a stateless backend has no state for), counted in
  `switchyard_ignored_fields_total{api,field}` and listed in the README;
- refused: a 400 naming the field and why — honouring it silently would change the answer.

A field neither the struct nor the table knows is a 400 naming it, as before (the structs forbid
unknown fields): strict on typos, liberal on what the real API accepts.
`tests/gateway/http/test_fields.py` holds every table against the official SDKs' request types, so a
field a newer SDK sends is a one-line decision here; the README's lists are generated from the
tables (`switchyard fields`, `gateway.cli.fields`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec
from prometheus_client import Counter

from plugins.contract.errors import InvalidRequest


@dataclass(frozen=True)
class FieldTable:
    api: str  # the `api` label: chat, completions, responses, messages, count_tokens, embeddings
    struct: type[msgspec.Struct]
    ignored: Mapping[str, str] = field(default_factory=dict)  # field -> why accepting it changes nothing
    refused: Mapping[str, str] = field(default_factory=dict)  # field -> why it is a 400

    def __post_init__(self) -> None:
        names = set(self.struct.__struct_fields__)
        unknown = (set(self.ignored) | set(self.refused)) - names
        if unknown:
            raise TypeError(f"{self.api}: fields the table lists but {self.struct.__name__} lacks: {sorted(unknown)}")
        both = set(self.ignored) & set(self.refused)
        if both:
            raise TypeError(f"{self.api}: fields both ignored and refused: {sorted(both)}")
        object.__setattr__(self, "_screened", tuple((name, name in self.refused) for name in (*self.refused, *self.ignored)))

    @property
    def acted_on(self) -> frozenset[str]:
        return frozenset(self.struct.__struct_fields__) - set(self.ignored) - set(self.refused)

    def screen(self, request: msgspec.Struct, ignored: Counter | None) -> None:
        """`InvalidRequest` naming the first refused field `request` carries; each ignored one it
        carries counted in `ignored` (`switchyard_ignored_fields_total`; None: not counted, for a
        request no client sent). A field is carried when it is set to anything but None."""
        for name, refused in self._screened:  # type: ignore[attr-defined]
            value = getattr(request, name)
            if value is None or value is msgspec.UNSET:
                continue
            if refused:
                raise InvalidRequest(f"`{name}` is not supported: {self.refused[name]}", param=name)
            if ignored is not None:
                ignored.labels(self.api, name).inc()
