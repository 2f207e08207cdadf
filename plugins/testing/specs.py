"""Requests as the gateway builds them. The battery writes each request as an OpenAI JSON body
and puts it through the gateway's own decoding and validation (`gateway.chat_api.schemas`,
`gateway.chat_api.translate`), so a backend sees exactly the `RequestSpec` a client's request would
become, defaults filled in, and an extension a backend does not declare is refused by the same
`check_capabilities` that guards every route.

This is the one module under `plugins/` that reads `gateway/`: the battery stands where the
gateway stands, in front of a backend; nothing in the server imports `plugins.testing`.
"""

from __future__ import annotations

import itertools
from typing import Any

import msgspec

from plugins.contract.capabilities import check_capabilities
from plugins.contract.errors import SwitchyardError
from plugins.contract.protocol import Capabilities, RequestSpec

MAX_N = 128  # the most choices the gateway's schema allows; a backend's own limit is its capability

_ids = itertools.count(1)


def _decode(body: dict[str, Any], kind: str) -> Any:
    from gateway.chat_api import schemas as S

    struct = S.ChatCompletionRequest if kind == "chat" else S.CompletionRequest
    return msgspec.json.decode(msgspec.json.encode(body), type=struct)


def build_spec(kind: str, model: str, **body: Any) -> RequestSpec:
    """The RequestSpec for a chat (`messages=`) or completion (`prompt=`) body; `InvalidRequest`
    when the gateway would answer 400 before routing."""
    from gateway.chat_api.translate import chat_spec, check_chat, check_completion, completion_spec

    request = _decode({"model": model, **body}, kind)
    request_id = f"plugin-check-{next(_ids)}"
    if kind == "chat":
        check_chat(request, max_n=MAX_N)
        return chat_spec(request, request_id=request_id, upstream_model=model)
    check_completion(request, max_n=MAX_N)
    return completion_spec(request, request_id=request_id, upstream_model=model)


def gateway_refusal(spec: RequestSpec, caps: Capabilities, backend: str) -> SwitchyardError | None:
    """The error the gateway answers `spec` with for a backend of these capabilities, before
    anything is sent to it; None when it would be sent."""
    try:
        check_capabilities(spec, caps, backend)
    except SwitchyardError as exc:
        return exc
    return None
