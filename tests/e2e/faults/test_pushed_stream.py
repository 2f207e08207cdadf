"""A proxied stream's middle relayed in push mode: each upstream read parsed, normalized and
written to the client from the upstream connection's callback (`UpstreamEvents._push`), without
waking the request's task. Served as `switchyard serve` serves (`gw`), against the same gateway
on uvicorn's own protocol (`plain_gw`: no direct writes, so every event takes the task path).
The upstream paces its events (`pace:<ms>`) so that each arrives in a read of its own, and a
spy on the real `_push` shows that the pushing happened."""

from __future__ import annotations

import json
import re
import socket
import uuid

import httpx
import pytest

from gateway.service.stream_feed import StreamFeed
from plugins.proxy.stream import UpstreamEvents
from tests.gateway.helpers import data_of
from tests.support.fault_gateway import ENGINES, IDLE_S, chat, fault_config
from tests.support.faulty_upstream import FaultyUpstream
from tests.support.gateway_thread import GatewayThread
from tests.support.probes import wait_until
from tests.support.server import free_port

_IDS = re.compile(rb'"(?:chatcmpl|cmpl)-[0-9a-f]+"|(?<="created":)\d+')


@pytest.fixture
def pushed_texts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The plain tokens `StreamFeed` was pushed on the short path (the real method runs)."""
    texts: list[str] = []
    push_text = StreamFeed.push_text

    def spy(self: StreamFeed, index: int, text: str) -> bool:
        texts.append(text)
        return push_text(self, index, text)

    monkeypatch.setattr(StreamFeed, "push_text", spy)
    return texts


@pytest.fixture
def pushed(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The pieces `UpstreamEvents` was pushed (the real method runs)."""
    pieces: list[bytes] = []
    push = UpstreamEvents._push

    def spy(self: UpstreamEvents, piece: bytes) -> bool:
        pieces.append(piece)
        return push(self, piece)

    monkeypatch.setattr(UpstreamEvents, "_push", spy)
    return pieces


def sse(base: str, path: str, body: dict) -> bytes:
    """The streamed body, its response ids and timestamps blanked."""
    with httpx.Client(base_url=base, timeout=15) as http:
        with http.stream("POST", path, json={**body, "stream": True}, headers={"x-request-id": uuid.uuid4().hex}) as r:
            assert r.status_code == 200
            raw = r.read()
    return _IDS.sub(b"0", raw)


WORDS = " ".join(f"w{i}" for i in range(12))


def framed_apart(raw: bytes) -> list[bytes]:
    """The stream's chunks, one per content delta, finish and usage. The pace keeps the upstream's
    events in reads of their own, but on a loaded machine the last word and the finish may share
    a read, and then one chunk (on either path): the same answer, framed differently."""
    chunks: list[bytes] = []
    for event in data_of(raw):
        if not isinstance(event, dict) or not event.get("choices"):
            chunks.append(json.dumps(event).encode())
            continue
        (choice,) = event["choices"]
        if choice["delta"] and choice["finish_reason"] is not None:
            chunks.append(json.dumps({**event, "choices": [{**choice, "finish_reason": None}]}).encode())
            choice = {**choice, "delta": {}}
        chunks.append(json.dumps({**event, "choices": [choice]}).encode())
    return chunks


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("fault", ["", "fault:malformed_after", "fault:not_object_after", "fault:echo_auth_event",
                                   "fault:die_mid_stream", "fault:stall_mid_stream"])
def test_pushed_bytes_are_the_task_paths(gw: GatewayThread, plain_gw: GatewayThread, pushed: list[bytes],
                                         pushed_texts: list[str], engine: str, fault: str) -> None:
    """The same bytes with and without push mode, ending, failing or stalling mid-stream: an
    error in a pushed piece still comes after the events before it, then `[DONE]`."""
    prompt = f"pace:5 {fault} {WORDS}".replace("  ", " ")
    body = chat(f"m-{engine}", prompt, stream_options={"include_usage": True})
    with_push = sse(gw.base, "/v1/chat/completions", body)
    assert pushed  # events came by push
    assert pushed_texts and set(pushed_texts) <= {f" {w}" for w in prompt.split()}  # plain tokens by the short path
    count = len(pushed)
    without = sse(plain_gw.base, "/v1/chat/completions", body)
    assert len(pushed) == count  # nothing pushed behind uvicorn's own protocol
    assert framed_apart(with_push) == framed_apart(without)
    events = data_of(with_push)
    assert events[-1] == "[DONE]"
    assert ("error" in events[-2]) == bool(fault), events[-2]
    if "stall" in fault:
        assert "stalled" in events[-2]["error"]["message"]


def test_routes_behind_litestar_are_not_pushed(gw: GatewayThread, plain_gw: GatewayThread, pushed: list[bytes]) -> None:
    """Litestar wraps `send` (no direct writes there): legacy completions, like every streamed
    route but chat completions, take the task path."""
    body = {"model": "m-vllm", "prompt": f"pace:5 {WORDS}", "max_tokens": 50}
    assert sse(gw.base, "/v1/completions", body) == sse(plain_gw.base, "/v1/completions", body)
    assert not pushed


def test_pushed_pieces_move_the_idle_deadline(gw: GatewayThread, pushed: list[bytes]) -> None:
    """Events 100 ms apart for longer than `idle_s` in all: no stall, as every piece moves the
    idle deadline (read lazily by the connection's timer)."""
    events = IDLE_S / 0.1 * 2
    words = " ".join(f"w{i}" for i in range(int(events)))
    raw = sse(gw.base, "/v1/chat/completions", chat("m-vllm", f"pace:100 {words}"))
    assert len(pushed) >= events / 2
    data = data_of(raw)
    assert data[-1] == "[DONE]" and all("error" not in e for e in data[:-1]), data[-2]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in data[:-1] if c["choices"]) == f" pace:100 {words}"


def test_a_client_leaving_mid_push_cancels_the_upstream(gw: GatewayThread, upstream: FaultyUpstream,
                                                        pushed: list[bytes]) -> None:
    request_id = uuid.uuid4().hex
    body = {**chat("m-vllm", "fault:slow", max_tokens=1000), "stream": True}
    with httpx.Client(base_url=gw.base, timeout=10) as http:
        with http.stream("POST", "/v1/chat/completions", json=body, headers={"x-request-id": request_id}) as r:
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data: ")
                if seen >= 5:
                    break
    assert pushed
    assert wait_until(lambda: (upstream.request(request_id) or {}).get("outcome") == "client_closed", timeout=3)


def test_a_slow_reader_hands_over_to_the_task_and_loses_nothing(gw: GatewayThread, upstream: FaultyUpstream,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that reads nothing for a while: the direct writes are refused once the
    transport's buffer is full, the request's task takes over (and waits for the client), and
    every byte still arrives, in order."""
    refused: list[bool] = []
    written = StreamFeed._written

    def spy(self: StreamFeed, out: bytes) -> bool:
        ok = written(self, out)
        refused.append(not ok)
        return ok

    monkeypatch.setattr(StreamFeed, "_written", spy)
    words = [f"{i:04d}" + "x" * 2000 for i in range(1500)]  # 3 MB of text, far beyond the socket buffers
    payload = json.dumps({**chat("m-vllm", "pace:1 " + " ".join(words), max_tokens=2000), "stream": True}).encode()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", gw.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(payload), payload))
        assert wait_until(lambda: any(refused), timeout=10)  # the client has not read a byte yet
        raw = b""
        while chunk := sock.recv(1 << 16):
            raw += chunk
    assert not all(refused)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    data = data_of(_dechunk(body))
    assert data[-1] == "[DONE]" and all("error" not in e for e in data[:-1])
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in data[:-1] if c["choices"])
    assert text == " pace:1 " + " ".join(words)


def _dechunk(body: bytes) -> bytes:
    out = b""
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out
        out, body = out + body[:size], body[size + 2:]


def test_a_deadline_ends_a_pushed_stream(upstream: FaultyUpstream, pushed: list[bytes]) -> None:
    """The route's `request_timeout_s` passing mid-stream ends it with an error event and
    `[DONE]` (the pump's interrupt cancels the waiting task) and hangs up on the upstream."""
    config = fault_config(upstream.url, f"http://127.0.0.1:{free_port()}").replace(
        "breaker_failures = 1000", "breaker_failures = 1000\nrequest_timeout_s = 0.5")
    request_id = uuid.uuid4().hex
    with GatewayThread(config) as g, httpx.Client(base_url=g.base, timeout=10) as http:
        body = {**chat("m-vllm", "fault:slow", max_tokens=1000), "stream": True}
        with http.stream("POST", "/v1/chat/completions", json=body, headers={"x-request-id": request_id}) as r:
            data = data_of(r.read())
    assert pushed
    assert data[-1] == "[DONE]" and data[-2]["error"]["type"] == "timeout_error", data[-2:]
    assert any("content" in c["choices"][0]["delta"] for c in data[:-2] if "choices" in c and c["choices"])
    assert wait_until(lambda: (upstream.request(request_id) or {}).get("outcome") == "client_closed", timeout=3)


def test_the_drain_ends_a_pushed_stream(gw: GatewayThread, upstream: FaultyUpstream, pushed: list[bytes]) -> None:
    """The end of a drain period (`cut_in_flight`) mid-stream: an error event and `[DONE]`
    after the events already sent, and the upstream hung up on."""
    request_id = uuid.uuid4().hex
    body = {**chat("m-vllm", "fault:slow", max_tokens=1000), "stream": True}
    with httpx.Client(base_url=gw.base, timeout=10) as http:
        with http.stream("POST", "/v1/chat/completions", json=body, headers={"x-request-id": request_id}) as r:
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: ") and len(pushed) >= 3:
                    break
            gw.call(gw.gateway.cut_in_flight)
            data = data_of("".join(f"{line}\n" for line in lines).encode())
    assert data[-1] == "[DONE]" and "shut down" in data[-2]["error"]["message"], data[-2:]
    assert wait_until(lambda: (upstream.request(request_id) or {}).get("outcome") == "client_closed", timeout=3)
