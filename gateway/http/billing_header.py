"""Claude Code's billing line, taken out of the prompt before it is rendered.

Claude Code (2.1.x) writes `x-anthropic-billing-header: cc_version=<version>.<3 hex>;
cc_entrypoint=<entrypoint>; [cch=<5 hex>;]` as its first system block. The hex parts are hashes
of the request (in 2.1.332 of the first user turn; in the releases that add `cch=`, of the whole
body, so new every turn): a different line at the very start of the prompt defeats every prefix
cache and every prefix-hash router behind the gateway, and it means nothing to a model. Only the
Anthropic API itself reads it, so a route in front of one turns the strip off
(`strip_billing_header = false`).

`strip_billing_header` is the one rule (a pure function a front-end may call on system text);
`strip_billing_lines` applies it to a request's system and developer messages, as
`gateway.http.common.answer_client` does for every front-end.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from plugins.contract.protocol import RequestSpec

MARK = "x-anthropic-billing-header:"
_LINE = re.compile(r"^x-anthropic-billing-header:[^\n]*(?:\n|\Z)", re.MULTILINE)
_SYSTEM_ROLES = frozenset({"system", "developer"})


def strip_billing_header(text: str) -> str:
    """`text` without its billing lines (each line that starts with the header, with its line
    break); the rest of the text byte for byte. Text without one is returned as is."""
    if MARK not in text:
        return text
    return _LINE.sub("", text)


def strip_billing_lines(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """`messages` with the billing lines gone from their system and developer messages (a text
    part, or a message, that held nothing else is dropped); None when there was none, so that
    the request is not copied for nothing."""
    out: list[dict[str, Any]] | None = None
    for i, message in enumerate(messages):
        content = message.get("content")
        stripped = content if message.get("role") not in _SYSTEM_ROLES else _stripped(content)
        if stripped is not content and out is None:
            out = list(messages[:i])
        if out is not None and (stripped is content or stripped not in ("", [])):
            out.append(message if stripped is content else {**message, "content": stripped})
    return out


def _stripped(content: Any) -> Any:
    """`content` (a string or a list of parts) without billing lines: the same object when it
    had none."""
    if isinstance(content, str):
        return strip_billing_header(content)
    if not isinstance(content, list) or not any(isinstance(p, dict) and MARK in (p.get("text") or "") for p in content):
        return content
    parts = []
    for part in content:
        text = part.get("text") if isinstance(part, dict) else None
        if isinstance(text, str) and MARK in text:
            text = strip_billing_header(text)
            if not text:
                continue
            part = {**part, "text": text}
        parts.append(part)
    return parts


def without_billing_lines(spec: RequestSpec) -> RequestSpec:
    """`spec` with the billing lines gone from its messages (the same object when it had none)."""
    if spec.messages is None:
        return spec
    messages = strip_billing_lines(spec.messages)
    return spec if messages is None else msgspec.structs.replace(spec, messages=messages)
