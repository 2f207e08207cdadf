"""Streamed chat completions are served in front of Litestar's per-request layers
(`gateway/chat_api/streamed.py`); what the client sees must be what Litestar's own routes send."""

from __future__ import annotations

import httpx

from tests.gateway.helpers import chat_body


def _head(http: httpx.Client, path: str, body: dict) -> tuple[int, list[tuple[bytes, bytes]]]:
    with http.stream("POST", path, json=body, headers={"x-request-id": "one-id"}) as resp:
        resp.read()
    return resp.status_code, [(name, value) for name, value in resp.headers.raw if name.lower() != b"date"]


def test_a_streamed_chat_answer_has_the_head_litestar_gives_a_streamed_answer(http: httpx.Client) -> None:
    """The legacy completions route is served by Litestar (route handler, `to_response`): the
    same headers, values and order as the streamed chat answer built in front of it."""
    chat = _head(http, "/v1/chat/completions", chat_body(stream=True))
    legacy = _head(http, "/v1/completions", {"model": "echo-1", "prompt": "hi", "stream": True})
    assert chat == legacy
    assert (b"x-request-id", b"one-id") in chat[1] and (b"x-switchyard-backend", b"echo") in chat[1]


def test_a_chat_request_the_front_gives_back_is_answered_by_litestar(http: httpx.Client) -> None:
    """A body that does not decode, after the front read it, is replayed to the Litestar app
    and answered there: the same 400 as any bad body, with the request's id."""
    resp = http.post("/v1/chat/completions", content=b'{"stream": true, "model": ', headers={"x-request-id": "bad-one"})
    assert resp.status_code == 400
    assert resp.headers["x-request-id"] == "bad-one"
    assert resp.json()["error"]["type"] == "invalid_request_error"
