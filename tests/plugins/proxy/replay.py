"""A tiny HTTP/1.1 server for the proxy core's unit tests: it answers with a recorded upstream
response, byte-for-byte and in the recorded network pieces, or misbehaves on purpose (never
answers, stalls mid-stream). It also tells what the client did: how many connections it opened,
which bodies and headers it sent, and when it hung up."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support.recordings import Recording


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    reader: asyncio.StreamReader | None = field(default=None, repr=False)

    def json(self) -> Any:
        return json.loads(self.body)


Handler = Callable[[Received, asyncio.StreamWriter], Awaitable[bool]]  # returns keep-alive


@dataclass
class ReplayServer:
    handler: Handler | None = None
    connections: int = 0
    requests: list[Received] = field(default_factory=list)
    hung_up: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0
    _server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> ReplayServer:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self._server.close_clients() if hasattr(self._server, "close_clients") else None

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if line:
                        k, _, v = line.partition(":")
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                received = Received(method, path, headers, body, reader)
                self.requests.append(received)
                assert self.handler is not None
                keep = await self.handler(received, writer)
                if not keep:  # the server hangs up now
                    writer.close()
                    self.hung_up.set()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            # wait for the client to hang up (EOF), then record it
            try:
                while await reader.read(65536):
                    pass
            except ConnectionError:
                pass
            self.hung_up.set()
            writer.close()


def http_head(status: int, content_type: str, *, chunked: bool, length: int | None = None) -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error",
              503: "Service Unavailable"}.get(status, "Status")
    lines = [f"HTTP/1.1 {status} {reason}", f"content-type: {content_type}"]
    lines.append("transfer-encoding: chunked" if chunked else f"content-length: {length or 0}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def write_recording(writer: asyncio.StreamWriter, rec: Recording, *, delay: float = 0.0,
                          pause_after: int | None = None, release: asyncio.Event | None = None,
                          reader: asyncio.StreamReader | None = None) -> bool:
    """Send `rec` as its server did: SSE as HTTP chunks, one per recorded read."""
    if not rec.is_sse:
        writer.write(http_head(rec.status, rec.content_type or "application/json", chunked=False, length=len(rec.body)))
        writer.write(rec.body)
        await writer.drain()
        return True
    writer.write(http_head(rec.status, rec.content_type, chunked=True))
    await writer.drain()
    for i, chunk in enumerate(rec.chunks):
        if pause_after is not None and i == pause_after and release is not None:
            while not release.is_set():  # paused; a client that hangs up meanwhile is noticed
                if writer.transport.is_closing() or (reader is not None and reader.at_eof()):
                    raise ConnectionResetError("client hung up")
                await asyncio.sleep(0.02)
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()
        if delay:
            await asyncio.sleep(delay)
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    return True


def replay(rec: Recording, **kwargs: Any) -> Handler:
    async def handler(received: Received, writer: asyncio.StreamWriter) -> bool:
        return await write_recording(writer, rec, reader=received.reader, **kwargs)

    return handler
