"""Requests as the gateway builds them. The battery writes each request as an OpenAI JSON body;
whoever runs it (`switchyard plugin-check`, `switchyard.testing`) hands it the gateway's own
decoding and validation as a `SpecBuilder` (`gateway.chat_api.translate.spec_of_body`), so a
backend sees exactly the `RequestSpec` a client's request would become, defaults filled in; an
extension a backend does not declare is refused by the same `check_capabilities` that guards
every route.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from plugins.contract.capabilities import check_capabilities
from plugins.contract.errors import SwitchyardError
from plugins.contract.protocol import Capabilities, RequestSpec


class SpecBuilder(Protocol):
    def __call__(self, kind: Literal["chat", "completion"], model: str, body: dict[str, Any]) -> RequestSpec:
        """The RequestSpec for a chat (`messages`) or completion (`prompt`) body; `InvalidRequest`
        when the gateway would answer 400 before routing."""


def gateway_refusal(spec: RequestSpec, caps: Capabilities, backend: str) -> SwitchyardError | None:
    """The error the gateway answers `spec` with for a backend of these capabilities, before
    anything is sent to it; None when it would be sent."""
    try:
        check_capabilities(spec, caps, backend)
    except SwitchyardError as exc:
        return exc
    return None
