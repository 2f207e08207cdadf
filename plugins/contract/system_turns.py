"""System messages after the first one (`RequestSpec.messages`), folded into the first where they
should not stand in place.

OpenAI's and Anthropic's APIs both take a system message anywhere in a conversation (Claude Code
puts its environment right after the first user turn). ChatML templates render one in place;
others stop with `raise_exception` ("System role only supported at the beginning..."), and small
models trained with one leading system message answer a trailing one by rambling on. A backend's
`system_messages` option says what it does: "in_place" (the built-in engine still folds where
its template refuses them), or "fold": every system message's text joined into one system
message first (`fold_system_messages`), in order, so the model still reads them — before the
conversation rather than inside it.
"""

from __future__ import annotations

from typing import Any, Literal

SystemMessages = Literal["in_place", "fold"]  # a backend's `system_messages` option


def fold_system_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """`messages` with every system message's text joined (by a blank line) into one system
    message first; None when there is no system message after the first message."""
    if not any(m.get("role") == "system" for m in messages[1:]):
        return None
    texts = [_text(m.get("content")) for m in messages if m.get("role") == "system"]
    rest = [m for m in messages if m.get("role") != "system"]
    return [{"role": "system", "content": "\n\n".join(t for t in texts if t)}, *rest]


def _text(content: Any) -> str:
    if isinstance(content, list):  # OpenAI's content parts
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content or ""


def system_messages_as(option: SystemMessages, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` as a backend with `system_messages = option` sends them on."""
    return (fold_system_messages(messages) or messages) if option == "fold" else messages
