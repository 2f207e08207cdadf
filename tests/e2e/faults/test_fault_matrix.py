"""The upstream fault matrix: a real misbehaving upstream process on loopback, reached through
the `vllm` and `llamacpp` plugins. One test per row (each for both plugins); after each, the
`after_each_row` fixture checks that no task leaked, that no upstream connection is open beyond
the idle ones in the pools, and that the gateway still serves.

| fault                                  | the client gets                                       |
| -------------------------------------- | ----------------------------------------------------- |
| connection refused                     | 502, or the next arm on a fallback route              |
| no first byte within `first_byte_s`    | 504                                                   |
| upstream 429 / 500 / 503 + error body  | the same status, OpenAI shape, upstream message kept  |
| dies mid-stream                        | `data: {"error": ...}` then `data: [DONE]`, no hang   |
| malformed SSE or JSON                  | 502 before the first byte, an error event after it    |
| stalls mid-stream past `idle_s`        | an error event; the upstream connection is closed     |
| client disconnects                     | the upstream request is cancelled (seen upstream)     |
"""

from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest

from tests.gateway.helpers import assert_error_shape
from tests.support.fault_gateway import ENGINES, FIRST_BYTE_S, IDLE_S, chat
from tests.support.faulty_upstream import FaultyUpstream
from tests.support.probes import wait_until

pytestmark = pytest.mark.parametrize("engine", ENGINES)


def rid() -> str:
    return "fault-" + uuid.uuid4().hex[:12]


def post(http: httpx.Client, body: dict, request_id: str | None = None) -> httpx.Response:
    return http.post("/v1/chat/completions", json=body, headers={"x-request-id": request_id or rid()})


def stream_events(http: httpx.Client, body: dict, request_id: str | None = None) -> tuple[int, list]:
    """(status, the `data:` payloads: dicts, or the string "[DONE]")."""
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}, headers={"x-request-id": request_id or rid()}) as r:
        raw = r.read()
    if r.status_code != 200:
        return r.status_code, [json.loads(raw)]
    assert raw.endswith(b"\n\n"), raw[-200:]
    events = []
    for block in raw[:-2].split(b"\n\n"):
        assert block.startswith(b"data: "), block
        payload = block[6:]
        events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return 200, events


def assert_ends_with_error_event(events: list, error_type: str | None = None) -> dict:
    assert events[-1] == "[DONE]", events[-3:]
    error = assert_error_shape(events[-2])
    if error_type is not None:
        assert error["type"] == error_type, error
    assert all("error" not in e for e in events[:-2] if isinstance(e, dict)), events
    return error


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_connection_refused_is_502(http: httpx.Client, engine: str, stream: bool) -> None:
    body = chat(f"m-dead-{engine}", "hello there")
    if stream:
        status, events = stream_events(http, body)
        payload = events[0]
    else:
        resp = post(http, body)
        status, payload = resp.status_code, resp.json()
    assert status == 502
    error = assert_error_shape(payload)
    assert error["type"] == "upstream_error" and "unreachable" in error["message"]


def test_connection_refused_falls_back_to_the_next_arm(http: httpx.Client, engine: str) -> None:
    resp = post(http, chat(f"fallback-{engine}", "hello fallback"))
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-switchyard-backend"] == engine
    assert resp.json()["choices"][0]["message"]["content"] == " hello fallback"


@pytest.mark.parametrize("fault", ["hang_before_headers", "hang_after_headers"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_no_first_byte_in_time_is_504(http: httpx.Client, upstream: FaultyUpstream, engine: str, fault: str, stream: bool) -> None:
    request_id = rid()
    body = chat(f"m-{engine}", f"fault:{fault}")
    start = time.monotonic()
    if stream:
        status, events = stream_events(http, body, request_id)
        payload = events[0]
    else:
        resp = post(http, body, request_id)
        status, payload = resp.status_code, resp.json()
    elapsed = time.monotonic() - start
    assert status == 504, payload
    assert_error_shape(payload)
    assert FIRST_BYTE_S * 0.9 <= elapsed < FIRST_BYTE_S + 2, elapsed
    # the gateway hung up on the upstream: the request is over there too
    assert wait_until(lambda: (upstream.request(request_id) or {}).get("outcome") == "client_closed", timeout=3)


@pytest.mark.parametrize("code", [429, 500, 503])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_upstream_error_status_is_passed_on_in_openai_shape(http: httpx.Client, engine: str, code: int, stream: bool) -> None:
    body = chat(f"m-{engine}", f"fault:status:{code}")
    if stream:
        status, events = stream_events(http, body)
        payload = events[0]
    else:
        resp = post(http, body)
        status, payload = resp.status_code, resp.json()
    assert status == code
    error = assert_error_shape(payload)
    assert f"upstream says {code}" in error["message"]
    assert error["type"] == ("rate_limit_error" if code == 429 else "upstream_error" if code == 503 else "server_error")


def test_upstream_dying_mid_stream_ends_with_an_error_event(http: httpx.Client, engine: str) -> None:
    start = time.monotonic()
    status, events = stream_events(http, chat(f"m-{engine}", "one two fault:die_mid_stream"))
    assert status == 200
    assert time.monotonic() - start < 3
    texts = [e["choices"][0]["delta"].get("content") for e in events[:-2] if e["choices"]]
    assert "".join(t for t in texts if t) == " one two"
    assert_ends_with_error_event(events, "upstream_error")


def test_upstream_dying_before_a_json_answer_is_502(http: httpx.Client, engine: str) -> None:
    resp = post(http, chat(f"m-{engine}", "one two fault:die_mid_stream"))
    assert resp.status_code == 502
    assert_error_shape(resp.json())


@pytest.mark.parametrize("fault", ["malformed_first", "odd_shape_first"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_malformed_first_event_is_502_before_the_first_byte(
    http: httpx.Client, upstream: FaultyUpstream, engine: str, stream: bool, fault: str
) -> None:
    request_id = rid()
    body = chat(f"m-{engine}", f"fault:{fault}")
    if stream:
        status, events = stream_events(http, body, request_id)
        payload = events[0]
    else:
        resp = post(http, body, request_id)
        status, payload = resp.status_code, resp.json()
    assert status == 502
    assert ("not JSON" if fault == "malformed_first" else "unexpected shape") in assert_error_shape(payload)["message"]
    assert wait_until(lambda: (upstream.request(request_id) or {}).get("outcome") == "client_closed", timeout=3)


@pytest.mark.parametrize("fault", ["malformed_after", "not_object_after", "odd_shape_after", "bad_chunking_after"])
def test_malformed_event_after_the_first_is_an_error_event(http: httpx.Client, upstream: FaultyUpstream, engine: str, fault: str) -> None:
    request_id = rid()
    status, events = stream_events(http, chat(f"m-{engine}", f"one two fault:{fault}"), request_id)
    assert status == 200
    assert_ends_with_error_event(events, "upstream_error")
    assert wait_until(lambda: (upstream.request(request_id) or {}).get("outcome") == "client_closed", timeout=3)


def test_stall_mid_stream_past_the_idle_timeout(http: httpx.Client, upstream: FaultyUpstream, engine: str) -> None:
    request_id = rid()
    start = time.monotonic()
    status, events = stream_events(http, chat(f"m-{engine}", "one two fault:stall_mid_stream"), request_id)
    elapsed = time.monotonic() - start
    assert status == 200
    error = assert_ends_with_error_event(events)
    assert "stalled" in error["message"]
    assert IDLE_S * 0.9 <= elapsed < IDLE_S + 2, elapsed
    # the upstream saw its connection closed by the gateway, at about the idle timeout
    assert wait_until(lambda: (upstream.request(request_id) or {}).get("outcome") == "client_closed", timeout=3)
    record = upstream.request(request_id)
    assert record["ended"] - record["started"] < IDLE_S + 1.5


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_client_disconnect_cancels_the_upstream_request(gw, upstream: FaultyUpstream, engine: str, stream: bool) -> None:  # noqa: ANN001
    request_id = rid()
    body = {**chat(f"m-{engine}", "fault:slow", max_tokens=1000), "stream": stream}
    headers = {"x-request-id": request_id}
    if stream:
        with httpx.Client(base_url=gw.base, timeout=10) as http:
            with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status_code == 200
                seen = 0
                for line in r.iter_lines():
                    seen += line.startswith("data: ")
                    if seen >= 3:
                        break
            closed_at = time.time()  # leaving the block closed the connection mid-stream
    else:
        with httpx.Client(base_url=gw.base, timeout=0.5) as http, pytest.raises(httpx.ReadTimeout):
            http.post("/v1/chat/completions", json=body, headers=headers)  # gives up, closing the connection
        closed_at = time.time()
    assert wait_until(lambda: (upstream.request(request_id) or {}).get("outcome") == "client_closed", timeout=3), upstream.request(request_id)
    record = upstream.request(request_id)
    assert record["ended"] - closed_at < 1.0, record


def test_legacy_completions_take_the_same_faults(http: httpx.Client, engine: str) -> None:
    """The rows above on /v1/completions (the upstream's `text_completion` chunks)."""
    base = {"model": f"m-{engine}", "max_tokens": 50}
    ok = http.post("/v1/completions", json={**base, "prompt": "plain words"})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == " plain words"
    resp = http.post("/v1/completions", json={**base, "prompt": "fault:status:503"})
    assert resp.status_code == 503 and "upstream says 503" in assert_error_shape(resp.json())["message"]
    for fault in ("die_mid_stream", "malformed_after"):
        with http.stream("POST", "/v1/completions", json={**base, "prompt": f"one two fault:{fault}", "stream": True}) as r:
            raw = r.read()
        assert r.status_code == 200
        events = raw[:-2].split(b"\n\n")
        assert events[-1] == b"data: [DONE]"
        assert_error_shape(json.loads(events[-2][6:]))
        assert b'"text":" one"' in raw
