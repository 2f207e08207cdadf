"""Clients that drive a gateway's flow-control queue from a test, one HTTP/1.1 connection each
(`http.client`, so a test chooses when a request is sent, when its connection closes, and — with
several workers — which worker's connection it uses):

- `Client(base, key).send(request_id)` sends a chat request and reads its answer in a thread;
  `.result()` waits for it, `.leave()` closes the connection while it waits.
- `Holder(base)` fills a backend's one slot with a long stream until `release()` closes it.
- `served_order(sent)`: the request ids in the order their answers ended — with one slot, the
  order the queue served them in.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

MODEL = "smollm2-135m-instruct"


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


class Client:
    def __init__(self, base: str, key: str, connection: http.client.HTTPConnection | None = None) -> None:
        url = urlsplit(base)
        self.key = key
        self.connection = connection or http.client.HTTPConnection(url.hostname, url.port, timeout=120)
        self.request_id = ""
        self.finished_at: float | None = None
        self._reply: Reply | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def on_each_worker(cls, base: str, wanted: dict[str, list[str]], tries: int = 200) -> dict[str, list[Client]]:
        """Connections to the workers named in `wanted` (worker number -> the keys of its
        clients), found by asking `/health` on new connections: the kernel picks a connection's
        worker, and it keeps it while it lives."""
        found: dict[str, list[Client]] = {worker: [] for worker in wanted}
        for _ in range(tries):
            if all(len(found[w]) == len(keys) for w, keys in wanted.items()):
                return found
            url = urlsplit(base)
            connection = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
            connection.request("GET", "/health")
            response = connection.getresponse()
            response.read()
            worker = response.getheader("x-switchyard-worker") or ""
            if worker in wanted and len(found[worker]) < len(wanted[worker]):
                found[worker].append(cls(base, wanted[worker][len(found[worker])], connection))
            else:
                connection.close()
        raise AssertionError(f"no connections to every worker in {tries} tries: {({w: len(c) for w, c in found.items()})}")

    def _request(self, request_id: str, *, model: str, stream: bool, max_tokens: int, extra: dict[str, Any]) -> None:
        self.request_id = request_id
        body = {"model": model, "messages": [{"role": "user", "content": f"Say {request_id}."}], "max_tokens": max_tokens,
                "temperature": 0, "stream": stream, **extra}
        self.connection.request("POST", "/v1/chat/completions", json.dumps(body).encode(),
                                {"authorization": f"Bearer sk-{self.key}", "content-type": "application/json",
                                 "x-request-id": request_id})

    def send(self, request_id: str, *, model: str = MODEL, stream: bool = False, max_tokens: int = 4,
             extra: dict[str, Any] | None = None) -> Client:
        """Send the request now (`extra`: more body fields); its answer is read in a thread of its own."""
        self._request(request_id, model=model, stream=stream, max_tokens=max_tokens, extra=extra or {})
        self._thread = threading.Thread(target=self._read, name=f"client-{request_id}", daemon=True)
        self._thread.start()
        return self

    def chat(self, request_id: str, **kwargs: Any) -> Reply:
        return self.send(request_id, **kwargs).result()

    def _read(self) -> None:
        try:
            response = self.connection.getresponse()
            body = response.read()
            self._reply = Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, body)
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            self._error = exc
        self.finished_at = time.monotonic()

    def result(self, timeout: float = 120.0) -> Reply:
        assert self._thread is not None, "nothing was sent"
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"{self.request_id}: no answer within {timeout} s"
        if self._error is not None:
            raise self._error
        assert self._reply is not None
        return self._reply

    def leave(self) -> None:
        """Close the connection now, whatever it waits for (the client goes away)."""
        sock = self.connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.connection.close()


class Holder:
    """A stream that takes the backend's slot and holds it (hundreds of tokens to generate)
    until `release()` closes its connection."""

    def __init__(self, base: str, *, model: str = MODEL, key: str = "holder", max_tokens: int = 1800) -> None:
        self.client = Client(base, key)
        self.model = model
        self.max_tokens = max_tokens

    def __enter__(self) -> Holder:
        self.client._request("holder", model=self.model, stream=True, max_tokens=self.max_tokens, extra={"ignore_eos": True})
        response = self.client.connection.getresponse()  # the head goes out with the first tokens: it runs
        assert response.status == 200, response.read()[:500]
        return self

    def release(self) -> None:
        self.client.leave()

    def __exit__(self, *exc: object) -> None:
        self.release()


def served_order(sent: list[Client], timeout: float = 120.0) -> list[str]:
    """The request ids of `sent` in the order their answers ended (every one a 200)."""
    for client in sent:
        reply = client.result(timeout)
        assert reply.status == 200, (client.request_id, reply.status, reply.body[:300])
    return [c.request_id for c in sorted(sent, key=lambda c: c.finished_at or 0.0)]
