"""A real OpenAI-compatible upstream process that misbehaves on request, for the fault matrix.

    python -m tests.support.faulty_upstream [--port 0]      # prints "PORT <n>" once listening

It speaks just enough HTTP/1.1 (keep-alive, chunked SSE) to stand in for vLLM or llama-server:
`GET /health`, `GET /v1/models`, `GET /props` (llama.cpp's), `POST /v1/chat/completions` and
`POST /v1/completions`. A normal request is answered like vLLM: a stream echoing the last
message's words (role chunk, one chunk per word, the finish chunk, the usage chunk, `[DONE]`).

A word `fault:<name>` in the prompt makes that request misbehave:

| fault | what the upstream does |
| --- | --- |
| `status:<code>` | answers `<code>` with its own OpenAI-style error body ("upstream says <code>") |
| `hang_before_headers` | reads the request and never answers |
| `hang_after_headers` | sends `200` and SSE headers, then nothing |
| `die_mid_stream` | sends two chunks, then drops the connection (no chunked terminator) |
| `malformed_first` / `malformed_after` | the first event / the third event is not JSON |
| `not_object_after` | the third event is JSON but not an object |
| `odd_shape_first` / `odd_shape_after` | the first / third event is an object of the wrong shape |
| `bad_chunking_after` | two chunks, then bytes that break the HTTP chunked framing |
| `stall_mid_stream` | two chunks, then silence until the client hangs up |
| `slow` | one word every 50 ms, 400 words: a long stream to walk away from |
| `echo_auth` | answers 401 quoting the `Authorization` header it got (as some APIs do) |
| `echo_auth_event` | two chunks, then an error event quoting the `Authorization` header |

A word `pace:<ms>` (with or without a fault) makes the upstream wait that long before each
event after the head, so that each one reaches the gateway in a socket read of its own.

`POST /v1/embeddings` answers one small vector per input.

`GET /_stats` tells what happened, seen from the upstream: the connections open now and, per
request (keyed by its `x-request-id`), the fault, the `Authorization` and `traceparent` headers received, and the
outcome: `completed`, `client_closed` (the client hung up before the upstream was done: the
request was cancelled) or `server_closed` (the upstream dropped it on purpose). `POST /_reset`
forgets the requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

FAULT = re.compile(r"fault:(\S+)")
PACE = re.compile(r"pace:(\d+)")
SLOW_WORDS = 400
SLOW_DELAY_S = 0.05


@dataclass
class RequestRecord:
    id: str
    path: str
    fault: str
    authorization: str
    traceparent: str = ""  # the W3C trace context the gateway sent, if any
    started: float = field(default_factory=time.time)
    outcome: str = "running"
    ended: float | None = None


class ClientGone(Exception):
    """The client closed its side of the connection."""


class Connection:
    """One client connection: a read buffer that a watcher can fill while we stream, so
    seeing the client hang up never loses bytes of a next request."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buf = bytearray()
        self.eof = False

    async def _fill(self) -> None:
        data = await self.reader.read(65536)
        if not data:
            self.eof = True
            raise ClientGone()
        self.buf += data

    async def read_until(self, sep: bytes) -> bytes:
        while (i := self.buf.find(sep)) < 0:
            await self._fill()
        out = bytes(self.buf[: i + len(sep)])
        del self.buf[: i + len(sep)]
        return out

    async def read_exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            await self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def wait_closed_by_client(self) -> None:
        """Return when the client hangs up (reading whatever it still sends)."""
        while not self.eof:
            try:
                await self._fill()
            except (ClientGone, ConnectionError):
                self.eof = True

    async def send(self, data: bytes) -> None:
        if self.eof or self.writer.is_closing():
            raise ClientGone()
        self.writer.write(data)
        try:
            await self.writer.drain()
        except ConnectionError:
            raise ClientGone() from None


class Upstream:
    def __init__(self) -> None:
        self.open_connections = 0
        self.requests: dict[str, RequestRecord] = {}
        self.counter = 0

    # -- connections --------------------------------------------------------------------------

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open_connections += 1
        conn = Connection(reader, writer)
        try:
            while True:
                try:
                    head = await conn.read_until(b"\r\n\r\n")
                except (ClientGone, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if line:
                        k, _, v = line.partition(":")
                        headers[k.strip().lower()] = v.strip()
                body = await conn.read_exactly(int(headers.get("content-length", "0") or 0))
                keep_alive = await self.route(conn, method, path, headers, body)
                if not keep_alive:
                    return
        except (ClientGone, ConnectionError):
            return
        finally:
            self.open_connections -= 1
            writer.close()

    async def route(self, conn: Connection, method: str, path: str, headers: dict[str, str], body: bytes) -> bool:
        if method == "GET" and path == "/health":
            return await self.json(conn, 200, {"status": "ok"})
        if method == "GET" and path == "/v1/models":
            return await self.json(conn, 200, {"object": "list", "data": [{"id": "up", "object": "model", "max_model_len": 4096}]})
        if method == "GET" and path == "/props":
            return await self.json(conn, 200, {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 4})
        if method == "GET" and path == "/_stats":
            stats = {"open_connections": self.open_connections - 1, "requests": {k: asdict(v) for k, v in self.requests.items()}}
            return await self.json(conn, 200, stats)
        if method == "POST" and path == "/_reset":
            self.requests.clear()
            return await self.json(conn, 200, {"ok": True})
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            return await self.generate(conn, path, headers, json.loads(body))
        if method == "POST" and path == "/v1/embeddings":
            return await self.embeddings(conn, path, headers, json.loads(body))
        return await self.json(conn, 404, {"error": {"message": f"no route {method} {path}", "type": "not_found_error", "code": 404}})

    async def json(self, conn: Connection, status: int, obj: Any, *, keep_alive: bool = True) -> bool:
        data = json.dumps(obj).encode()
        head = (
            f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n"
            f"connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
        )
        await conn.send(head.encode() + data)
        return keep_alive

    async def embeddings(self, conn: Connection, path: str, headers: dict[str, str], body: dict[str, Any]) -> bool:
        """One vector per input: its length in characters and words (recorded like a generation)."""
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        self.counter += 1
        rid = headers.get("x-request-id") or f"anon-{self.counter}"
        self.requests[rid] = RequestRecord(id=rid, path=path, fault="ok", authorization=headers.get("authorization", ""),
                                           traceparent=headers.get("traceparent", ""), outcome="completed", ended=time.time())
        data = [{"object": "embedding", "index": i, "embedding": [float(len(text)), float(len(text.split()))]}
                for i, text in enumerate(inputs)]
        tokens = sum(len(text.split()) for text in inputs)
        return await self.json(conn, 200, {"object": "list", "data": data, "model": body["model"],
                                           "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    # -- generation ---------------------------------------------------------------------------

    async def generate(self, conn: Connection, path: str, headers: dict[str, str], body: dict[str, Any]) -> bool:
        chat = path.endswith("chat/completions")
        words = _words(body, chat)
        match = FAULT.search(" ".join(words))
        fault = match[1] if match else "ok"
        self.counter += 1
        rid = headers.get("x-request-id") or f"anon-{self.counter}"
        record = self.requests[rid] = RequestRecord(
            id=rid, path=path, fault=fault, authorization=headers.get("authorization", ""), traceparent=headers.get("traceparent", "")
        )
        try:
            keep_alive = await self._fault(conn, fault, chat, words, body, headers)
        except ClientGone:
            record.outcome = "client_closed"
            keep_alive = False
        except asyncio.CancelledError:
            record.outcome = "client_closed" if conn.eof else "server_closed"
            raise
        else:
            if record.outcome == "running":
                record.outcome = "completed" if keep_alive else "server_closed"
        record.ended = time.time()
        return keep_alive

    async def _fault(self, conn: Connection, fault: str, chat: bool, words: list[str], body: dict, headers: dict) -> bool:
        pace = PACE.search(" ".join(words))
        stream = Stream(conn, chat, body.get("model", "up"), int(pace[1]) / 1000 if pace else 0.0)
        if fault.startswith("status:"):
            code = int(fault.split(":")[1])
            etype = {429: "rate_limit_error", 503: "unavailable_error"}.get(code, "server_error")
            return await self.json(conn, code, {"error": {"message": f"upstream says {code}", "type": etype, "code": code}})
        if fault == "echo_auth":
            message = f"Incorrect API key provided: {headers.get('authorization', '')}"
            return await self.json(conn, 401, {"error": {"message": message, "type": "authentication_error", "code": 401}})
        if fault == "hang_before_headers":
            await conn.wait_closed_by_client()
            raise ClientGone()
        await stream.head()
        if fault == "hang_after_headers":
            await conn.wait_closed_by_client()
            raise ClientGone()
        if fault in ("malformed_first", "odd_shape_first"):
            await stream.raw_event(b"{this is not json" if fault == "malformed_first" else b'{"choices": [42]}')
            await conn.wait_closed_by_client()
            raise ClientGone()
        await stream.role()
        if fault == "slow":
            for i in range(SLOW_WORDS):
                await asyncio.sleep(SLOW_DELAY_S)
                await stream.text(f" w{i}")
            await stream.finish(len(words), SLOW_WORDS)
            return True
        for word in words[:2]:
            await stream.text(" " + word)
        if fault in ("malformed_after", "not_object_after", "odd_shape_after"):
            await stream.raw_event({"malformed_after": b"{broken", "not_object_after": b"42"}.get(fault, b'{"choices": [42]}'))
            await conn.wait_closed_by_client()
            raise ClientGone()
        if fault == "bad_chunking_after":
            await conn.send(b"zz\r\nthis is not a chunk\r\n")
            await conn.wait_closed_by_client()
            raise ClientGone()
        if fault == "echo_auth_event":
            message = f"Incorrect API key provided: {headers.get('authorization', '')}"
            await stream.event({"error": {"message": message, "type": "authentication_error", "code": 401}})
            await conn.wait_closed_by_client()
            raise ClientGone()
        if fault == "die_mid_stream":
            conn.writer.transport.abort()
            conn.eof = True
            return False
        if fault == "stall_mid_stream":
            await conn.wait_closed_by_client()
            raise ClientGone()
        for word in words[2:]:
            await stream.text(" " + word)
        await stream.finish(len(words), len(words))
        return True


class Stream:
    """A vLLM-style SSE response in HTTP chunked encoding."""

    def __init__(self, conn: Connection, chat: bool, model: str, pace_s: float = 0.0) -> None:
        self.conn = conn
        self.chat = chat
        self.model = model
        self.pace_s = pace_s

    async def head(self) -> None:
        await self.conn.send(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n"
            b"connection: keep-alive\r\n\r\n"
        )

    async def _chunk(self, data: bytes) -> None:
        await self.conn.send(b"%x\r\n" % len(data) + data + b"\r\n")

    async def raw_event(self, data: bytes) -> None:
        if self.pace_s:
            await asyncio.sleep(self.pace_s)
        await self._chunk(b"data: " + data + b"\n\n")

    async def event(self, obj: dict[str, Any]) -> None:
        await self.raw_event(json.dumps(obj).encode())

    def _base(self) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": "up-1", "object": obj, "created": 0, "model": self.model}

    def _choice(self, text: str, finish: str | None = None) -> dict[str, Any]:
        if self.chat:
            delta = {"content": text} if text else {}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    async def role(self) -> None:
        if self.chat:
            choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            await self.event({**self._base(), "choices": [choice]})

    async def text(self, text: str) -> None:
        await self.event({**self._base(), "choices": [self._choice(text)]})

    async def finish(self, prompt_tokens: int, completion_tokens: int) -> None:
        await self.event({**self._base(), "choices": [self._choice("", "stop")]})
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}
        await self.event({**self._base(), "choices": [], "usage": usage})
        await self.raw_event(b"[DONE]")
        await self.conn.send(b"0\r\n\r\n")


def _words(body: dict[str, Any], chat: bool) -> list[str]:
    if chat:
        content = (body.get("messages") or [{}])[-1].get("content") or ""
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        return str(content).split()
    prompt = body.get("prompt")
    return prompt.split() if isinstance(prompt, str) else [str(t) for t in prompt or []]


async def serve(port: int) -> None:
    upstream = Upstream()
    server = await asyncio.start_server(upstream.handle, "127.0.0.1", port)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    try:
        asyncio.run(serve(args.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())


# -- for the tests: start the process ----------------------------------------------------------


class FaultyUpstream:
    """A running `faulty_upstream` process (see `start`)."""

    def __init__(self, proc: Any, port: int) -> None:
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def stats(self) -> dict[str, Any]:
        import httpx

        return httpx.get(self.url + "/_stats", timeout=5, headers={"connection": "close"}).json()

    def request(self, request_id: str) -> dict[str, Any] | None:
        return self.stats()["requests"].get(request_id)

    def reset(self) -> None:
        import httpx

        httpx.post(self.url + "/_reset", timeout=5, headers={"connection": "close"})


def start(log_path: str | None = None) -> FaultyUpstream:
    """Start the upstream process on a free loopback port; stop it with `stop(upstream)`."""
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    stderr = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.faulty_upstream", "--port", "0"],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=stderr,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"faulty upstream did not start: {line!r}")
    return FaultyUpstream(proc, int(line.split()[1]))


def stop(upstream: FaultyUpstream) -> None:
    upstream.proc.terminate()
    try:
        upstream.proc.wait(timeout=5)
    except Exception:  # noqa: BLE001
        upstream.proc.kill()
        upstream.proc.wait()
