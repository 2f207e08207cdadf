"""Small helpers shared by the gateway tests: the OpenAI error shape, SSE parsing."""

from __future__ import annotations

import json
from typing import Any

ERROR_KEYS = {"message", "type", "param", "code"}


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def chat_body(text: str = "hello big world", model: str = "echo-1", **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": user(text), **fields}


def assert_error_shape(body: Any) -> dict[str, Any]:
    """`body` is exactly {"error": {"message", "type", "param", "code"}} with string/null values;
    returns the inner object."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == ERROR_KEYS, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert error["code"] is None or isinstance(error["code"], str), error
    return error


def split_events(raw: bytes) -> list[bytes]:
    """The SSE body cut at the blank lines; asserts the body ends with one."""
    assert raw.endswith(b"\n\n"), raw[-200:]
    return raw[:-2].split(b"\n\n")


def data_events(raw: bytes) -> list[Any]:
    """Every event's `data:` payload, JSON-decoded except the final `[DONE]` (kept as the str)."""
    out: list[Any] = []
    for event in split_events(raw):
        assert event.startswith(b"data: "), event
        payload = event[len(b"data: ") :]
        out.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return out


def data_of(raw: bytes) -> list:
    assert raw.endswith(b"\n\n"), raw[-200:]
    return [block[6:].decode() if block == b"data: [DONE]" else json.loads(block[6:]) for block in raw[:-2].split(b"\n\n")]
