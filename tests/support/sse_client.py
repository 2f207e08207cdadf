"""A lean HTTP/1.1 client on raw asyncio streams for load: POST JSON, read a chunked SSE (or
a plain JSON) answer. Much cheaper per chunk than a general client, so that on a small machine
the gateway, not the client, is what a load run measures. Used by
tests/e2e/test_concurrent_streams.py and bench/soak.py."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes  # de-chunked
    ttfb_s: float  # until the first body bytes
    total_s: float
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


async def post(host: str, port: int, path: str, payload: dict[str, Any], headers: dict[str, str] | None = None,
               timeout: float = 120.0) -> Answer:
    """One request on its own connection (closed afterwards)."""
    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
            try:
                return await _exchange(reader, writer, host, port, path, payload, headers or {}, start)
            finally:
                writer.close()
    except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
        return Answer(0, {}, b"", 0.0, time.perf_counter() - start, error=repr(exc))


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int, path: str,
                    payload: dict[str, Any], headers: dict[str, str], start: float) -> Answer:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = json.dumps(payload).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n{extra}"
                 f"content-length: {len(data)}\r\nconnection: close\r\n\r\n".encode() + data)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    response_headers = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            response_headers[k.strip().lower()] = v.strip()
    ttfb = None
    body = bytearray()
    if response_headers.get("transfer-encoding") == "chunked":
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if ttfb is None:
                ttfb = time.perf_counter() - start
            if size == 0:
                break
            body += chunk[:-2]
    else:
        body += await reader.readexactly(int(response_headers.get("content-length", "0")))
        ttfb = time.perf_counter() - start
    return Answer(status, response_headers, bytes(body), ttfb, time.perf_counter() - start)


def sse_data(body: bytes) -> list[Any]:
    """The `data:` payloads of an SSE body: JSON objects, and the final "[DONE]"."""
    assert body.endswith(b"\n\n"), body[-200:]
    out: list[Any] = []
    for event in body[:-2].split(b"\n\n"):
        assert event.startswith(b"data: "), event[:200]
        payload = event[6:]
        out.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return out
