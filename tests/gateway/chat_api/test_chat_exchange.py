"""The streamed chat route served by our own server exchange (`gateway/chat_api/exchange.py`, no ASGI
cycle), seen on raw sockets: the same head bytes uvicorn's cycle writes (the plain gateway is
the bare Litestar app on uvicorn's own protocol), keep-alive and pipelined requests mixing it with
routes Litestar answers on one connection, `Connection: close` and HTTP/1.0 as uvicorn answers
them, and a client that leaves while the stream waits for it to read."""

from __future__ import annotations

import json
import socket
import uuid

import pytest
from uvicorn.protocols.http.flow_control import FlowControl

from gateway.chat_api.exchange import ChatExchange
from tests.gateway.helpers import data_of
from tests.support.fault_gateway import after_each_row, chat, gw, plain_gw, upstream  # noqa: F401 - fixtures
from tests.support.faulty_upstream import FaultyUpstream
from tests.support.gateway_thread import GatewayThread
from tests.support.probes import wait_until


def _request(body: dict | bytes | None, *, path: str = "/v1/chat/completions", version: str = "HTTP/1.1",
             headers: str = "") -> bytes:
    """A raw request; `body` None: a GET."""
    if body is None:
        return f"GET {path} {version}\r\nhost: x\r\n{headers}\r\n".encode()
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    return (f"POST {path} {version}\r\nhost: x\r\ncontent-type: application/json\r\n{headers}"
            f"content-length: {len(payload)}\r\n\r\n").encode() + payload


class Wire:
    """Responses read off one client socket, one at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> None:
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("closed by the server")
        self.buf += data

    def until(self, sep: bytes) -> bytes:
        while sep not in self.buf:
            self._fill()
        out, _, self.buf = self.buf.partition(sep)
        return out

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def response(self) -> tuple[bytes, bytes]:
        """The head (without its blank line) and the body, de-chunked."""
        head = self.until(b"\r\n\r\n")
        fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
        if fields.get(b"transfer-encoding") == b"chunked":
            body = b""
            while size := int(self.until(b"\r\n"), 16):
                body += self._take(size)
                assert self._take(2) == b"\r\n"
            assert self._take(2) == b"\r\n"
            return head, body
        return head, self._take(int(fields.get(b"content-length", b"0")))

    def closed(self) -> bool:
        """The server closed the connection (nothing more comes)."""
        self.sock.settimeout(5)
        return not self.buf and self.sock.recv(1) == b""


def _connect(gw: GatewayThread) -> Wire:
    return Wire(socket.create_connection(("127.0.0.1", gw.port), timeout=10))


def _status(head: bytes) -> int:
    return int(head.split(b" ", 2)[1])


def _field(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b": ")
        if key == name:
            return value
    return None


@pytest.fixture
def served_by_exchange(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The heads our exchange wrote (the real method runs)."""
    heads: list[bytes] = []
    start = ChatExchange._start

    def spy(self: ChatExchange, fields: list[tuple[bytes, bytes]]) -> bytes:
        heads.append(head := start(self, fields))
        return head

    monkeypatch.setattr(ChatExchange, "_start", spy)
    return heads


def _without_date(head: bytes) -> bytes:
    return b"\r\n".join(line for line in head.split(b"\r\n") if not line.startswith(b"date: "))


@pytest.mark.parametrize(("version", "headers", "closes"), [
    ("HTTP/1.1", "", False), ("HTTP/1.1", "connection: close\r\n", True), ("HTTP/1.0", "", True),
])
def test_the_head_and_the_connection_are_what_uvicorns_cycle_gives(
        gw: GatewayThread, plain_gw: GatewayThread, served_by_exchange: list[bytes], version: str, headers: str,
        closes: bool) -> None:
    """Against the bare Litestar app on uvicorn's protocol: the same head bytes (but the date),
    the same events; HTTP/1.0 gets uvicorn's chunked answer and `connection: close`, and the
    connection closes after it exactly when uvicorn's does."""
    answers = []
    for g in (gw, plain_gw):
        wire = _connect(g)
        with wire.sock:
            # (`pace:5`: each event a read of its own, so that neither server can join the last
            # token with the finish when the other does not)
            wire.sock.sendall(_request({**chat("m-vllm", "pace:5 one two three"), "stream": True}, version=version,
                                       headers=headers + "x-request-id: same-id\r\n"))
            head, body = wire.response()
            events = [e if e == "[DONE]" else {**e, "id": "", "created": 0} for e in data_of(body)]
            answers.append((_without_date(head), events, wire.closed() if closes else None))
            if not closes:  # still open: the next request is answered on it
                wire.sock.sendall(_request(None, path="/v1/models"))
                assert _status(wire.response()[0]) == 200
    assert len(served_by_exchange) == 1
    assert answers[0][0] == answers[1][0]
    assert answers[0][0].startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in answers[0][0]
    assert (b"connection: close" in answers[0][0]) is closes
    assert answers[0][1] == answers[1][1] and answers[0][1][-1] == "[DONE]"
    assert answers[0][2] is answers[1][2] is (True if closes else None)


MIXED = [  # (request, status, streamed): the fast route, Litestar's routes, and the front giving back
    (_request({**chat("m-vllm", "first stream"), "stream": True}, headers="x-request-id: r0\r\n"), 200, True),
    (_request(None, path="/v1/models", headers="x-request-id: r1\r\n"), 200, False),
    (_request(chat("m-llamacpp", "not streamed"), headers="x-request-id: r2\r\n"), 200, False),
    (_request(b'{"stream": true, "model": ', headers="x-request-id: r3\r\n"), 400, False),
    (_request({**chat("m-llamacpp", "second stream"), "stream": True}, headers="x-request-id: r4\r\n"), 200, True),
    (_request({**chat("m-nobody", "no such model"), "stream": True}, headers="x-request-id: r5\r\n"), 404, False),
    (_request({**chat("m-vllm", "last stream"), "stream": True}, headers="x-request-id: r6\r\n"), 200, True),
]


@pytest.mark.parametrize("pipelined", [False, True], ids=["keep-alive", "pipelined"])
def test_one_connection_mixes_the_exchange_and_litestars_routes(gw: GatewayThread, served_by_exchange: list[bytes],
                                                              pipelined: bool) -> None:
    """One after another, or all written at once (each waits for the answers before it): every
    answer in order, with its own request id, on one connection."""
    wire = _connect(gw)
    with wire.sock:
        if pipelined:
            wire.sock.sendall(b"".join(request for request, _, _ in MIXED))
        for i, (request, status, streamed) in enumerate(MIXED):
            if not pipelined:
                wire.sock.sendall(request)
            head, body = wire.response()
            assert _status(head) == status, (i, head, body)
            assert _field(head, b"x-request-id") == f"r{i}".encode()
            if streamed:
                assert data_of(body)[-1] == "[DONE]"
            else:
                assert _field(head, b"content-type") == b"application/json"
                json.loads(body)
    assert len(served_by_exchange) == 3


@pytest.mark.parametrize("pipelined", [False, True], ids=["alone", "before-a-pipelined-request"])
def test_a_client_leaving_while_the_stream_waits_for_it_cancels_the_upstream(
        gw: GatewayThread, upstream: FaultyUpstream, monkeypatch: pytest.MonkeyPatch, pipelined: bool) -> None:
    """The client reads nothing: the transport pauses writing and the stream waits (flow
    control); the client then goes away, which ends that wait and the upstream request (also
    when it has sent the next request already: uvicorn tells only that one of the loss)."""
    paused: list[bool] = []
    pause = FlowControl.pause_writing

    def spy(self: FlowControl) -> None:
        paused.append(True)
        pause(self)

    monkeypatch.setattr(FlowControl, "pause_writing", spy)
    request_id = uuid.uuid4().hex
    words = [f"{i:04d}" + "x" * 2000 for i in range(1800)]  # 3.6 MB of text, far beyond the socket buffers
    body = {**chat("m-vllm", "pace:2 " + " ".join(words), max_tokens=2000), "stream": True}
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", gw.port))
        sock.sendall(_request(body, headers=f"x-request-id: {request_id}\r\n")
                     + (_request(None, path="/v1/models") if pipelined else b""))
        assert wait_until(lambda: bool(paused), timeout=10)
    assert wait_until(lambda: (upstream.request(request_id) or {}).get("outcome") == "client_closed", timeout=10)


def test_a_body_that_follows_100_continue_in_pieces_is_read(gw: GatewayThread, served_by_exchange: list[bytes]) -> None:
    """`Expect: 100-continue`: the exchange says continue when it reads the body (as uvicorn's
    `receive` does), and a body sent after that, in two pieces, is read whole."""
    payload = json.dumps({**chat("m-vllm", "sent in two pieces"), "stream": True}).encode()
    wire = _connect(gw)
    with wire.sock:
        wire.sock.sendall(b"POST /v1/chat/completions?from=test HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n"
                          b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(payload))
        assert wire.until(b"\r\n\r\n") == b"HTTP/1.1 100 Continue"
        wire.sock.sendall(payload[:20])
        wire.sock.sendall(payload[20:])
        head, body = wire.response()
    assert _status(head) == 200 and len(served_by_exchange) == 1
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in data_of(body)[:-1] if e["choices"])
    assert text == " sent in two pieces"
