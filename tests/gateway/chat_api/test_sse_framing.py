"""The SSE bytes on the wire, read with httpx: framing, usage placement, errors mid-stream, and
cancellation of the backend when the client goes away."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.gateway.conftest import TOKEN_DELAY_S, Server
from tests.gateway.helpers import assert_error_shape, chat_body, data_events, split_events, user
from tests.support.probes import metric, wait_until

# A disconnect must reach the backend within this many seconds (the contract's 100 ms).
CANCEL_DEADLINE_S = 0.100


def stream_raw(http: httpx.Client, path: str, body: dict) -> httpx.Response:
    with http.stream("POST", path, json=body) as resp:
        resp.read()
    return resp


def check_framing(resp: httpx.Response) -> list:
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.headers["cache-control"] == "no-cache"
    assert resp.headers.get("x-accel-buffering") == "no"
    assert "content-length" not in resp.headers
    raw = resp.content
    assert b"\r" not in raw, "events must be LF-only"
    events = split_events(raw)
    for event in events:
        # exactly one line per event, and that line is a data field
        assert b"\n" not in event, event
        assert event.startswith(b"data: "), event
    assert events[-1] == b"data: [DONE]"
    assert raw.endswith(b"data: [DONE]\n\n")
    assert raw.count(b"[DONE]") == 1
    return data_events(raw)


def test_chat_stream_framing(http: httpx.Client) -> None:
    resp = stream_raw(http, "/v1/chat/completions", chat_body(stream=True))
    *chunks, done = check_framing(resp)
    assert done == "[DONE]"
    assert [set(c) for c in chunks] == [{"id", "object", "created", "model", "system_fingerprint", "choices"}] * len(chunks)
    assert chunks[0]["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
    deltas = [c["choices"][0]["delta"] for c in chunks[1:]]
    assert deltas == [{"content": "hello"}, {"content": " big"}, {"content": " world"}]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "stop"]
    assert len({c["id"] for c in chunks}) == 1
    assert len({c["created"] for c in chunks}) == 1


def test_no_usage_key_without_include_usage(http: httpx.Client) -> None:
    for options in ({}, {"stream_options": {"include_usage": False}}):
        *chunks, _ = check_framing(stream_raw(http, "/v1/chat/completions", chat_body(stream=True, **options)))
        assert all("usage" not in c for c in chunks)
        assert all(c["choices"] for c in chunks)


def test_include_usage_framing(http: httpx.Client) -> None:
    resp = stream_raw(http, "/v1/chat/completions", chat_body(stream=True, n=2, stream_options={"include_usage": True}))
    *chunks, usage_chunk, done = check_framing(resp)
    assert done == "[DONE]"
    assert all("usage" in c and c["usage"] is None for c in chunks)
    assert usage_chunk["choices"] == []
    assert usage_chunk["id"] == chunks[0]["id"]
    assert usage_chunk["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 6,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    roles = [c for c in chunks if c["choices"][0]["delta"].get("role")]
    assert sorted(c["choices"][0]["index"] for c in roles) == [0, 1]


def test_completions_stream_framing(http: httpx.Client) -> None:
    resp = stream_raw(http, "/v1/completions", {"model": "echo-1", "prompt": "a b c", "stream": True})
    *chunks, done = check_framing(resp)
    assert done == "[DONE]"
    assert all(c["object"] == "text_completion" and c["id"].startswith("cmpl-") for c in chunks)
    # no role chunk: every chunk carries text
    assert [c["choices"][0]["text"] for c in chunks] == ["a", " b", " c"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "stop"]


def test_completions_stream_include_usage(http: httpx.Client) -> None:
    resp = stream_raw(
        http, "/v1/completions", {"model": "echo-1", "prompt": "a b c", "stream": True, "stream_options": {"include_usage": True}}
    )
    *chunks, usage_chunk, _ = check_framing(resp)
    assert all(c["usage"] is None for c in chunks)
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["total_tokens"] == 6


def test_error_after_stream_began(http: httpx.Client) -> None:
    resp = stream_raw(http, "/v1/chat/completions", chat_body("a b c FAILMID:2 d", stream=True))
    *chunks, error_event, done = check_framing(resp)
    assert done == "[DONE]"
    assert [c["choices"][0]["delta"] for c in chunks] == [{"role": "assistant", "content": ""}, {"content": "a"}, {"content": " b"}]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    error = assert_error_shape(error_event)
    assert error["type"] == "upstream_error"
    assert "mid-stream" in error["message"]


def test_error_before_first_token_is_plain_http(http: httpx.Client) -> None:
    with http.stream("POST", "/v1/chat/completions", json=chat_body("FAIL:invalid", stream=True)) as resp:
        resp.read()
    assert resp.status_code == 400
    assert resp.headers["content-type"].startswith("application/json")
    error = assert_error_shape(resp.json())
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "messages"


@pytest.mark.parametrize("kind,status", [("overloaded", 429), ("unavailable", 503), ("timeout", 504), ("bad_gateway", 502)])
def test_stream_failures_before_first_token_keep_their_status(http: httpx.Client, kind: str, status: int) -> None:
    with http.stream("POST", "/v1/chat/completions", json=chat_body(f"FAIL:{kind}", stream=True)) as resp:
        resp.read()
    assert resp.status_code == status
    assert_error_shape(resp.json())


def test_events_are_flushed_one_by_one(http: httpx.Client) -> None:
    """With 50 ms between tokens, the first content chunk must arrive long before the last one
    exists: no buffering of the whole response, no batching timers."""
    words = " ".join(f"w{i}" for i in range(8))
    arrivals: list[float] = []
    start = time.monotonic()
    with http.stream("POST", "/v1/chat/completions", json=chat_body(words, model="slow-1", stream=True)) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.monotonic() - start)
    assert len(arrivals) == 1 + 8
    # 8 tokens take >= 0.4 s in total; the first token must be out after about one delay
    assert arrivals[1] < arrivals[-1] - 4 * TOKEN_DELAY_S
    gaps = [b - a for a, b in zip(arrivals[1:], arrivals[2:])]
    assert min(gaps) > TOKEN_DELAY_S / 2, gaps


# -- cancellation ----------------------------------------------------------------------------------


def _wait_cancel(server: Server, request_id: str, timeout: float = 3.0) -> float | None:
    """The backend's timestamp for the cancel of `request_id`, or None if it never came."""
    assert server.cancel_log is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.cancel_log.exists():
            for line in server.cancel_log.read_text().splitlines():
                rid, _, stamp = line.partition(" ")
                if rid == request_id:
                    return float(stamp)
        time.sleep(0.01)
    return None


def _requests_total(http: httpx.Client, route: str, outcome: str) -> float:
    return metric(http.get("/metrics").text, "switchyard_requests_total", route=route, outcome=outcome)


LONG = " ".join(f"w{i}" for i in range(200))  # 200 tokens at 50 ms: 10 s if nobody cancels


@pytest.mark.parametrize("attempt", range(3))
def test_disconnect_cancels_backend_within_100ms(server: Server, attempt: int) -> None:
    request_id = f"cancel-httpx-{attempt}-{time.time_ns()}"
    with httpx.Client(base_url=server.base, timeout=10) as http:
        cancelled_before = _requests_total(http, "slow-1", "cancelled")
        with http.stream(
            "POST", "/v1/chat/completions", json=chat_body(LONG, model="slow-1", stream=True), headers={"x-request-id": request_id}
        ) as resp:
            assert resp.headers["x-request-id"] == request_id
            seen = 0
            for line in resp.iter_lines():
                if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                    seen += 1
                    if seen == 2:
                        # from here on the client is going away: leaving the loop and the block
                        # closes the response, and an unfinished streamed body closes the socket
                        closed_at = time.time()
                        break
        cancelled_at = _wait_cancel(server, request_id)
        assert cancelled_at is not None, "the backend never saw the cancel"
        lag = cancelled_at - closed_at
        print(f"cancel lag {lag * 1000:.2f} ms")
        assert lag < CANCEL_DEADLINE_S, f"backend saw the cancel {lag * 1000:.1f} ms after the disconnect"
        # the gateway records the outcome right after the backend's finally
        assert wait_until(lambda: _requests_total(http, "slow-1", "cancelled") == cancelled_before + 1, timeout=2)


def test_openai_client_close_cancels_backend(server: Server) -> None:
    request_id = f"cancel-openai-{time.time_ns()}"
    with openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0) as client:
        stream = client.chat.completions.create(
            model="slow-1", messages=user(LONG), stream=True, extra_headers={"x-request-id": request_id}
        )
        contents = []
        for chunk in stream:
            contents += [ch.delta.content for ch in chunk.choices if ch.delta.content]
            if len(contents) == 2:
                closed_at = time.time()
                break
        stream.close()
    assert contents == ["w0", " w1"]
    cancelled_at = _wait_cancel(server, request_id)
    assert cancelled_at is not None, "the backend never saw the cancel"
    assert cancelled_at - closed_at < CANCEL_DEADLINE_S


def test_non_streaming_disconnect_cancels_backend(server: Server) -> None:
    """A client that gives up on a non-streaming request (timeout) must not leave the backend
    generating (vLLM's test_basic `test_request_cancellation` checks the same)."""
    request_id = f"cancel-nonstream-{time.time_ns()}"
    with httpx.Client(base_url=server.base, timeout=0.3) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/chat/completions", json=chat_body(LONG, model="slow-1"), headers={"x-request-id": request_id})
        closed_at = time.time()
    cancelled_at = _wait_cancel(server, request_id, timeout=1.0)
    assert cancelled_at is not None, "the backend kept generating after the client went away"
    assert cancelled_at - closed_at < CANCEL_DEADLINE_S
