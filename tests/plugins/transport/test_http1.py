"""The proxies' HTTP/1.1 client (plugins.transport.http1) against small asyncio servers on loopback: body
framings, keep-alive and its expiry, back-pressure, the pool limit, deadlines, failures."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from plugins.transport import http1

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]


class Server:
    """Accepts connections and hands each to `handler`; counts connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return "http://127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return lines[0].encode(), headers, body


def answering(*responses: bytes, keep_open: bool = True) -> Handler:
    """Answers each request on a connection with the next of `responses`."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for response in responses:
            await read_request(reader)
            writer.write(response)
            await writer.drain()
        if keep_open:
            await reader.read()

    return handler


CHUNKED = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
SIZED = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"


@pytest.mark.parametrize("response", [CHUNKED, SIZED], ids=["chunked", "content-length"])
def test_keep_alive_reuses_the_connection(response: bytes) -> None:
    async def main() -> tuple[list[bytes], int]:
        async with Server(answering(response, response, response)) as server:
            pool = http1.Pool(server.url)
            bodies = []
            for _ in range(3):
                resp = await pool.request("GET", "/x")
                bodies.append(await resp.read())
                await resp.aclose()
            await pool.aclose()
            return bodies, server.connections

    bodies, connections = run(main())
    assert bodies == [bodies[0]] * 3 and bodies[0] in (b"hello world", b"hello")
    assert connections == 1


def test_a_body_that_ends_with_the_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it")
        await writer.drain()

    async def main() -> tuple[bytes, int]:
        async with Server(handler) as server:
            pool = http1.Pool(server.url)
            resp = await pool.request("GET", "/")
            body = await resp.read()
            await resp.aclose()
            idle = pool.idle_connections
            await pool.aclose()
            return body, idle

    assert run(main()) == (b"all of it", 0)


def test_request_line_headers_and_body_go_out_as_given() -> None:
    seen: list[tuple[bytes, dict[str, str], bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(SIZED)
        await writer.drain()

    async def main() -> None:
        async with Server(handler) as server:
            pool = http1.Pool(server.url + "/prefix/", headers={"User-Agent": "ua"})
            resp = await pool.request("POST", "/v1/x", b'{"a":1}', {"content-type": "application/json"})
            await resp.read()
            await resp.aclose()
            await pool.aclose()

    run(main())
    line, headers, body = seen[0]
    assert line == b"POST /prefix/v1/x HTTP/1.1"
    assert headers["user-agent"] == "ua" and headers["content-type"] == "application/json"
    assert headers["host"].startswith("127.0.0.1:") and body == b'{"a":1}'


def test_requests_are_these_bytes_on_the_wire() -> None:
    """The request head (line, the pool's fields, the request's, the length) byte for byte, for
    the first request to a path and the later ones (whose head the pool keeps made)."""
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = [int(line[16:]) for line in head.split(b"\r\n") if line.startswith(b"content-length: ")]
            seen.append(head + await reader.readexactly(length[0] if length else 0))
            writer.write(SIZED)
            await writer.drain()

    async def main() -> str:
        async with Server(handler) as server:
            pool = http1.Pool(server.url + "/prefix/", headers={"User-Agent": "ua", "x-fixed": "1"})
            for method, path, body, headers in [
                ("POST", "/v1/x", b'{"a":1}', {"content-type": "application/json", "x-request-id": "r1"}),
                ("POST", "/v1/x", b'{"b":2}', {"content-type": "application/json", "x-request-id": "r2"}),
                ("POST", "/v1/x", b"", None),
                ("GET", "/v1/models", b"", None),
                ("GET", "/v1/models", b"", {"x-request-id": "r3"}),
            ]:
                resp = await pool.request(method, path, body, headers)
                await resp.read()
                await resp.aclose()
            await pool.aclose()
            return server.url.removeprefix("http://")

    host = run(main()).encode()
    fixed = b"host: " + host + b"\r\nuser-agent: ua\r\nx-fixed: 1\r\n"
    assert seen == [
        b"POST /prefix/v1/x HTTP/1.1\r\n" + fixed + b"content-type: application/json\r\nx-request-id: r1\r\n"
        b'content-length: 7\r\n\r\n{"a":1}',
        b"POST /prefix/v1/x HTTP/1.1\r\n" + fixed + b"content-type: application/json\r\nx-request-id: r2\r\n"
        b'content-length: 7\r\n\r\n{"b":2}',
        b"POST /prefix/v1/x HTTP/1.1\r\n" + fixed + b"content-length: 0\r\n\r\n",
        b"GET /prefix/v1/models HTTP/1.1\r\n" + fixed + b"\r\n",
        b"GET /prefix/v1/models HTTP/1.1\r\n" + fixed + b"x-request-id: r3\r\n\r\n",
    ]


def test_header_values_cannot_smuggle_lines() -> None:
    with pytest.raises(ValueError, match="line break"):
        http1.Pool("http://127.0.0.1:1", headers={"x": "a\r\nevil: 1"})
    for name, value in [("x", "a\nb"), ("x", "a\rb"), ("x\n", "a"), ("x", "\r\n")]:
        with pytest.raises(ValueError, match=re.escape(f"header {name!r} holds a line break")):
            http1.Pool("http://127.0.0.1:1")._message("POST", "/", b"", {"ok": "1", name: value})


def test_response_headers_by_name() -> None:
    """`header(name)` is what `headers` has under that name: matched whatever the case it was
    sent in, the last of a repeated one, the default when absent."""

    async def main() -> tuple[dict[str, str], list[str]]:
        head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Twice: 1\r\nx-twice: 2\r\nX-Odd: \xe9\r\n"
                b"content-length: 2\r\n\r\nok")
        async with Server(answering(head)) as server:
            pool = http1.Pool(server.url)
            resp = await pool.request("GET", "/")
            found = [resp.header(name) for name in ("content-type", "x-twice", "x-odd", "x-none")]
            found.append(resp.header("x-none", "absent"))
            headers = resp.headers
            await resp.read()
            await resp.aclose()
            await pool.aclose()
            return headers, found

    headers, found = run(main())
    assert found == ["text/plain", "2", "\xe9", "", "absent"]
    assert [headers.get(name, "") for name in ("content-type", "x-twice", "x-odd", "x-none")] == found[:4]


def test_reading_pauses_at_the_high_water_mark_and_resumes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http1, "READ_HIGH_WATER", 1000)
    total = 200_000

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total)
        for _ in range(total // 1000):
            writer.write(b"x" * 1000)
            await writer.drain()
        await reader.read()

    async def main() -> tuple[int, bool]:
        async with Server(handler) as server:
            pool = http1.Pool(server.url)
            resp = await pool.request("GET", "/")
            await asyncio.sleep(0.2)  # the server keeps writing; we do not read
            conn = resp._conn
            assert conn is not None
            paused, held = conn.paused, conn.buffered
            assert held < total  # the socket was left to fill up
            body = await resp.read()
            await resp.aclose()
            await pool.aclose()
            return len(body), paused

    size, paused = run(main())
    assert size == total and paused


def test_closing_a_response_early_closes_its_connection() -> None:
    hung_up = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await reader.read()  # EOF: the client hung up
        hung_up.set()

    async def main() -> int:
        async with Server(handler) as server:
            pool = http1.Pool(server.url)
            resp = await pool.request("GET", "/")
            assert await resp.next_piece() == b"abc"
            await resp.aclose()
            await asyncio.wait_for(hung_up.wait(), 2)
            idle = pool.idle_connections
            await pool.aclose()
            return idle

    assert run(main()) == 0


def test_an_expired_idle_connection_is_not_reused() -> None:
    async def main() -> int:
        async with Server(answering(SIZED, SIZED)) as server:
            pool = http1.Pool(server.url, idle_expiry_s=0.05)
            for _ in range(2):
                resp = await pool.request("GET", "/")
                await resp.read()
                await resp.aclose()
                await asyncio.sleep(0.1)
            await pool.aclose()
            return server.connections

    assert run(main()) == 2


def test_the_pool_limit_makes_the_next_request_wait_then_time_out() -> None:
    async def main() -> None:
        async with Server(answering(SIZED, SIZED)) as server:
            pool = http1.Pool(server.url, max_connections=1, acquire_timeout_s=0.1)
            first = await pool.request("GET", "/")
            with pytest.raises(http1.PoolTimeout):
                await pool.request("GET", "/")
            await first.read()
            await first.aclose()
            second = await pool.request("GET", "/")  # the slot is free again
            assert await second.read() == b"hello"
            await second.aclose()
            await pool.aclose()

    run(main())


def test_no_answer_before_the_deadline_is_a_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    async def main() -> None:
        async with Server(silent) as server:
            pool = http1.Pool(server.url)
            deadline = asyncio.get_running_loop().time() + 0.1
            with pytest.raises(TimeoutError):
                await pool.request("GET", "/", deadline=deadline)
            assert pool.busy_connections == 0
            await pool.aclose()

    run(main())


def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: refused

    async def main() -> None:
        pool = http1.Pool(f"http://127.0.0.1:{port}")
        with pytest.raises(http1.ConnectError):
            await pool.request("GET", "/")
        await pool.aclose()

    run(main())


def test_a_connection_cut_mid_body_is_an_error() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
        await writer.drain()

    async def main() -> None:
        async with Server(cut) as server:
            pool = http1.Pool(server.url)
            resp = await pool.request("GET", "/")
            with pytest.raises(http1.ConnectionClosed):
                await resp.read()
            await resp.aclose()
            await pool.aclose()

    run(main())


def test_garbage_is_a_protocol_error() -> None:
    async def main() -> None:
        async with Server(answering(b"SMTP ready\r\n\r\n")) as server:
            pool = http1.Pool(server.url)
            with pytest.raises(http1.ProtocolError):
                await pool.request("GET", "/")
            await pool.aclose()

    run(main())


def test_the_idle_timer_follows_a_moving_deadline_and_fires_at_the_last_one() -> None:
    """One loop timer per connection: a later deadline keeps the armed timer, which re-arms
    itself at the current deadline when it fires early; an earlier deadline re-arms it at once.
    The timer is fired by hand here, so nothing depends on the clock."""

    async def main() -> None:
        pool = http1.Pool("http://127.0.0.1:9")
        conn = http1._Connection(pool)
        now = asyncio.get_running_loop().time()
        first = asyncio.create_task(conn.wait(now + 100))
        await asyncio.sleep(0)
        assert conn._timer_at == now + 100
        conn._wake()  # a piece arrived
        await first
        second = asyncio.create_task(conn.wait(now + 200))  # the idle deadline moved on
        await asyncio.sleep(0)
        assert conn._timer_at == now + 100  # not re-armed per piece
        conn._on_timer(now + 100)  # the old timer fires while the deadline is later: re-armed, no timeout
        assert conn._timer_at == now + 200 and not second.done()
        conn._wake()
        await second
        third = asyncio.create_task(conn.wait(now + 50))  # an earlier deadline re-arms at once
        await asyncio.sleep(0)
        assert conn._timer_at == now + 50
        conn._on_timer(now + 50)
        with pytest.raises(TimeoutError):
            await third
        conn.close()
        assert conn._timer is None
        await pool.aclose()

    run(main())


def test_pieces_are_pushed_to_on_piece_until_it_hands_control_back() -> None:
    """While `next_piece(on_piece=...)` waits, each read's body bytes go to `on_piece` in the
    connection's callback; its False ends the wait with b"", and what arrives next is the next
    call's, in order."""
    pushed: list[bytes] = []
    took = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await took.wait()  # the client has the head
        for piece in (b"one", b"two"):
            took.clear()
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await took.wait()
        writer.write(b"5\r\nthree\r\n0\r\n\r\n")

    def on_piece(piece: bytes) -> bool:
        pushed.append(piece)
        took.set()
        return piece != b"two"

    async def main() -> list[bytes | None]:
        async with Server(handler) as server:
            pool = http1.Pool(server.url)
            resp = await pool.request("GET", "/")
            took.set()
            got = [await resp.next_piece(None, on_piece), await resp.next_piece(), await resp.next_piece()]
            await resp.aclose()
            await pool.aclose()
            return got

    assert run(main()) == [b"", b"three", None]
    assert pushed == [b"one", b"two"]


def test_a_request_meeting_only_stale_keep_alive_connections_gets_a_new_one() -> None:
    """llama.cpp's server ends a keep-alive connection after a few requests: a request sent on it
    meets a close and no answer. The retry must not take another idle connection that may be
    ending too (seen: 502s under 64 streams through a real llama-server), but a new one."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(SIZED)
        await writer.drain()
        await read_request(reader)  # the next request on this connection: closed unanswered

    async def main() -> None:
        async with Server(handler) as server:
            pool = http1.Pool(server.url)
            first = await asyncio.gather(pool.request("GET", "/"), pool.request("GET", "/"))
            for response in first:
                assert await response.read() == b"hello"
                await response.aclose()
            assert pool.idle_connections == 2
            response = await pool.request("GET", "/")
            assert await response.read() == b"hello"
            await response.aclose()
            await pool.aclose()
            assert server.connections == 3

    run(main())
