"""The one small interface every routing strategy implements: given a request, its route and the
route's candidate targets (routable, not tried yet, never empty), pick one.

`in_flight` is the gateway's requests in flight per backend, `load` each backend's
engine-reported load (`switchyard_route`'s arguments). `options` is the struct the route's
`options` table decodes to; `check` refuses what decodes but makes no sense, naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import msgspec

from plugins.contract.config_types import Route, Target
from plugins.contract.protocol import RequestSpec


class NoOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    pass


class Strategy(Protocol):
    options: type[msgspec.Struct]

    def check(self, options: msgspec.Struct, where: str) -> None: ...

    def pick(self, spec: RequestSpec, route: Route, candidates: Sequence[Target], in_flight: Mapping[str, int],
             load: Mapping[str, float]) -> Target: ...


class Unchecked:
    """The do-nothing `check` of strategies whose options need nothing beyond decoding."""

    options: type[msgspec.Struct] = NoOptions

    def check(self, options: msgspec.Struct, where: str) -> None:
        pass
