"""A lean HTTP/1.1 client for the proxies' upstream hop: a keep-alive pool of asyncio protocol
connections parsed by httptools (llhttp, the parser uvicorn uses).

Why not httpx here: for every request httpcore's pool walks every pooled connection (expiry,
idleness, a readability probe of its socket), and h11 parses each body chunk in pure Python.
At 64 concurrent streams that was over half of the gateway's CPU (bench/README.md). This client
does O(1) work per request and one parser call per socket read.

    pool = Pool("http://127.0.0.1:8001", headers={"user-agent": "switchyard-proxy"})
    response = await pool.request("POST", "/v1/chat/completions", body, headers)
    while (piece := await response.next_piece(deadline)) is not None:
        ...
    await response.aclose()      # back to the pool when the body was read to its end

Body pieces come out as they arrive: everything that arrived since the last call, joined, never
waiting for more. Or they are pushed: `next_piece(deadline, on_piece)` hands each socket read's
body bytes to `on_piece` from the connection's `data_received` while it waits, with no task
wake-up or loop turn per read (the proxies' relay of a stream's middle events). A response
closed before its end closes its connection (that is how an upstream learns the client went
away). A request whose connection the server closed without a byte of answer is retried once on
a fresh connection: that is what a server closing an idle keep-alive connection just as it is
reused looks like.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import httptools

READ_HIGH_WATER = 1 << 20  # unread body bytes at which reading from the socket pauses
MAX_REQUEST_HEADS = 64  # (method, path) pairs whose request head a pool keeps made


class HTTPError(Exception):
    """Any failure of the upstream exchange."""


class ConnectError(HTTPError):
    """No connection could be made."""


class ConnectTimeout(ConnectError):
    """No connection within the connect timeout."""


class PoolTimeout(HTTPError):
    """Every connection the pool may open stayed busy for the acquire timeout."""


class ProtocolError(HTTPError):
    """The upstream sent something that is not HTTP/1.1."""


class ConnectionClosed(HTTPError):
    """The connection was closed or reset before the response ended."""

    def __init__(self, message: str, *, before_response: bool = False) -> None:
        super().__init__(message)
        self.before_response = before_response


class _Connection(asyncio.Protocol):
    """One keep-alive connection; holds the state of the exchange in progress."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.paused = False
        self.idle_since = 0.0
        # one timer per connection, moved lazily: a stream's idle deadline moves with every
        # piece, and re-arming a loop timer per piece costs more than the rest of the wait
        self.deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._wake_soon = False
        self.loop = asyncio.get_running_loop()
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.pieces: list[bytes] = []
        self.buffered = 0
        self.complete = False
        self.keep_alive = False
        self.error: HTTPError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.on_piece: Callable[[bytes], bool] | None = None  # see `Response.next_piece`
        self.received = False  # any byte of this exchange's response

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ProtocolError(f"malformed HTTP response: {exc}"))
            self.close()
            return
        if self.on_piece is not None:
            self._push()  # this read's body bytes, joined (no loop turn: nothing else joins them)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.closed = True
        self.pool._forget(self)
        if self.complete or self.error is not None:
            return
        if self.headers_done and self._ends_at_close():
            self.complete = True
            self._wake()
            return
        reason = f": {exc}" if exc else ""
        self._fail(ConnectionClosed(f"the server closed the connection{reason}", before_response=not self.received))

    # -- httptools callbacks ----------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if 100 <= self.status < 200:  # an interim response (100 Continue): its final one follows
            self.status = 0
            self.raw_headers = []
            return
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.pieces.append(body)
        self.buffered += len(body)
        if self.buffered >= READ_HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        if not self._wake_soon and self.on_piece is None:  # (pushed at the end of `data_received`)
            # the reader is woken one loop turn later: the bytes of this stream that arrive in
            # that turn join the same piece (one parse, one client write for them all; the
            # gateway's pump task used to give that turn)
            self._wake_soon = True
            self.loop.call_soon(self._wake_later)

    def _push(self) -> None:
        """The body bytes here to `on_piece` while the reader waits with one (not with the end of
        the body or a failure: the reader is woken for those; after its wait ended it takes them
        itself); its False hands control back: it is called no more and the reader wakes."""
        on_piece, waiter = self.on_piece, self.waiter
        if (on_piece is None or not self.pieces or self.complete or self.error is not None
                or waiter is None or waiter.done()):
            return
        if not on_piece(self.take_pieces()):
            self.on_piece = None
            waiter.set_result(None)

    def _wake_later(self) -> None:
        self._wake_soon = False
        if self.on_piece is None:
            self._wake()
        else:  # bytes that arrived before the push began
            self._push()

    def on_message_complete(self) -> None:
        if self.headers_done:
            self.keep_alive = self.parser.should_keep_alive()  # llhttp forgets it once the message is done
            self.complete = True
            self._wake()

    # -- helpers -----------------------------------------------------------------------------

    def _ends_at_close(self) -> bool:
        """A response with neither Content-Length nor chunked encoding ends when the
        connection does."""
        names = {name.lower() for name, _ in self.raw_headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    def _fail(self, error: HTTPError) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, deadline: float | None) -> None:
        """Until the parser reports something new; TimeoutError at loop time `deadline`."""
        # (the connection's loop: asyncio.get_running_loop() asks for the process id, a system call)
        self.waiter = waiter = self.loop.create_future()
        self.deadline = deadline
        if deadline is not None and (self._timer is None or self._timer_at > deadline):
            self._arm(deadline)
        try:
            await waiter
        finally:
            self.waiter = None

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.loop.call_at(at, self._on_timer, at)

    def _on_timer(self, at: float) -> None:
        self._timer = None
        waiter, deadline = self.waiter, self.deadline
        if waiter is None or waiter.done() or deadline is None:
            return
        if deadline <= at:
            waiter.set_exception(TimeoutError())
        else:  # the deadline moved on since the timer was set
            self._arm(deadline)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def send(self, request: bytes) -> None:
        self._reset()
        assert self.transport is not None
        self.transport.write(request)

    def close(self) -> None:
        self._disarm()
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
            self.pool._forget(self)

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and self.error is None and not self.closed

    def take_pieces(self) -> bytes:
        """The body bytes that arrived and were not taken yet, joined; reading resumes."""
        pieces, self.pieces, self.buffered = self.pieces, [], 0
        if self.paused:
            self.resume()
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def resume(self) -> None:
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()


class Response:
    """The response to one request: status and headers are read; the body is read with
    `next_piece` or `read`. Always `aclose()` it."""

    def __init__(self, conn: _Connection) -> None:
        self._conn: _Connection | None = conn
        self.status = conn.status
        self._raw_headers = conn.raw_headers
        self._headers: dict[str, str] | None = None

    @property
    def headers(self) -> dict[str, str]:
        """Every header by its lower-case name (the last of a repeated one)."""
        if self._headers is None:
            self._headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in self._raw_headers}
        return self._headers

    def header(self, name: str, default: str = "") -> str:
        """`headers.get(name, default)` (`name` in lower case), without decoding the others."""
        key = name.encode("latin-1")
        found = None
        for raw_name, value in self._raw_headers:
            if raw_name.lower() == key:
                found = value
        return default if found is None else found.decode("latin-1")

    async def next_piece(self, deadline: float | None = None,
                         on_piece: Callable[[bytes], bool] | None = None) -> bytes | None:
        """The body bytes that arrived since the last call (waiting for some when there are
        none); None at the end of the body. TimeoutError at loop time `deadline`.

        `on_piece`: while this waits, the body bytes that arrive (not the end of the body, nor a
        failure) go to `on_piece(piece)` instead, one piece per socket read, called from the
        connection's callback (so it must not raise); it returns False to be called no more, and
        this returns b"" then. A pushed piece does not move `deadline`: `on_piece` does
        (`move_deadline`)."""
        conn = self._conn
        if conn is None:
            return None
        while not conn.pieces:
            if conn.error is not None:
                raise conn.error
            if conn.complete:
                return None
            if on_piece is None:
                await conn.wait(deadline)
                continue
            conn.on_piece = on_piece
            try:
                await conn.wait(deadline)
                handed_back = conn.on_piece is None  # (what came after is for the next call)
            finally:
                conn.on_piece = None
            if handed_back:
                return b""
        return conn.take_pieces()

    @property
    def complete(self) -> bool:
        """The whole body has arrived (or the response is closed): what is left unread of it is
        dropped by `aclose`, and the connection kept."""
        return self._conn is None or self._conn.complete

    def move_deadline(self, deadline: float) -> None:
        """From an `on_piece` callback: the waiting `next_piece` times out at this later loop
        time instead (the connection's timer reads it when it fires)."""
        if self._conn is not None:
            self._conn.deadline = deadline

    async def read(self, limit: int | None = None, deadline: float | None = None) -> bytes:
        """The rest of the body (at most about `limit` bytes)."""
        chunks: list[bytes] = []
        size = 0
        while (piece := await self.next_piece(deadline)) is not None:
            chunks.append(piece)
            size += len(piece)
            if limit is not None and size >= limit:
                break
        return b"".join(chunks)

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.pool._release(conn)


class Pool:
    """Keep-alive connections to one origin. At most `max_connections` requests are in flight
    at once (a further one waits up to `acquire_timeout_s`: PoolTimeout); at most `max_idle`
    idle connections are kept, each for `idle_expiry_s` (keep that below the server's own
    keep-alive timeout, so the server is never the one to close a connection we reuse)."""

    def __init__(self, base_url: str, *, headers: dict[str, str] | None = None, max_connections: int = 256,
                 max_idle: int = 256, idle_expiry_s: float = 4.0, connect_timeout_s: float = 5.0,
                 acquire_timeout_s: float = 10.0) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.tls = url.scheme == "https"
        self.host = url.hostname
        default_port = 443 if self.tls else 80
        self.port = url.port or default_port
        self.prefix = url.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal goes in brackets
        authority = host if self.port == default_port else f"{host}:{self.port}"
        fields = {"host": authority, **{k.lower(): v for k, v in (headers or {}).items()}}
        self._head_fields = _header_block(fields)
        self._request_heads: dict[tuple[str, str], bytes] = {}  # (method, path) -> request line and fixed fields
        self.max_idle = max_idle
        self.idle_expiry_s = idle_expiry_s
        self.connect_timeout_s = connect_timeout_s
        self.acquire_timeout_s = acquire_timeout_s
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[_Connection, None] = {}  # insertion-ordered: the newest is reused first
        self._busy: set[_Connection] = set()
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if self.tls else None
        self._closed = False

    async def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
                      deadline: float | None = None) -> Response:
        """Send the request; return once the response head has arrived (TimeoutError at loop
        time `deadline`). The caller must `aclose()` the response."""
        if self._closed:
            raise ConnectError("the connection pool is closed")
        message = self._message(method, path, body, headers)
        await self._acquire_slot()
        try:
            for attempt in (1, 2):
                conn = await self._connection(deadline, fresh=attempt == 2)
                try:
                    conn.send(message)
                    while not conn.headers_done:
                        if conn.error is not None:
                            raise conn.error
                        await conn.wait(deadline)
                except ConnectionClosed as exc:
                    self._discard(conn)
                    if attempt == 1 and exc.before_response:
                        continue  # what a server closing an idle keep-alive connection looks like
                    raise
                except BaseException:
                    self._discard(conn)
                    raise
                return Response(conn)
        except BaseException:
            self._slots.release()
            raise
        raise AssertionError("unreachable")

    async def _acquire_slot(self) -> None:
        if not self._slots.locked():
            await self._slots.acquire()  # returns at once: no timer needed
            return
        try:
            async with asyncio.timeout(self.acquire_timeout_s):
                await self._slots.acquire()
        except TimeoutError:
            raise PoolTimeout("every connection stayed busy") from None

    def _message(self, method: str, path: str, body: bytes, headers: dict[str, str] | None) -> bytes:
        head = self._request_heads.get((method, path))
        if head is None:
            head = b"%s %s HTTP/1.1\r\n" % (method.encode(), (self.prefix + path).encode()) + self._head_fields
            if len(self._request_heads) < MAX_REQUEST_HEADS:
                self._request_heads[method, path] = head
        extra = _header_block(headers) if headers else b""
        if body or method in ("POST", "PUT", "PATCH"):
            return b"%b%bcontent-length: %d\r\n\r\n%b" % (head, extra, len(body), body)
        return head + extra + b"\r\n"

    async def _connection(self, deadline: float | None, *, fresh: bool = False) -> _Connection:
        """An idle connection, else a new one; `fresh`: always a new one (the retry after a
        reused connection was closed: other idle ones may be closing too)."""
        now = time.monotonic()
        while self._idle and not fresh:
            conn, _ = self._idle.popitem()
            if conn.closed:
                continue
            if now - conn.idle_since > self.idle_expiry_s:
                conn.close()
                continue
            self._busy.add(conn)
            return conn
        conn = await self._connect(deadline)
        self._busy.add(conn)
        return conn

    async def _connect(self, deadline: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        timeout = self.connect_timeout_s
        if deadline is not None:
            timeout = min(timeout, max(0.0, deadline - loop.time()))
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self), self.host, self.port, ssl=self._ssl,
                    server_hostname=self.host if self.tls else None,
                )
        except TimeoutError:
            if deadline is not None and loop.time() >= deadline:
                raise
            raise ConnectTimeout(f"no connection to {self.host}:{self.port} within {self.connect_timeout_s:g} s") from None
        except OSError as exc:
            raise ConnectError(f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}") from None
        return conn

    def _release(self, conn: _Connection) -> None:
        """The response is done with: keep the connection when its exchange ended cleanly."""
        self._busy.discard(conn)
        self._slots.release()
        if conn.reusable() and not self._closed and len(self._idle) < self.max_idle:
            conn.idle_since = time.monotonic()
            conn.resume()
            self._idle[conn] = None
        else:
            conn.close()

    def _discard(self, conn: _Connection) -> None:
        self._busy.discard(conn)
        conn.close()

    def _forget(self, conn: _Connection) -> None:
        """A connection closed (by either side): it must not be handed out again."""
        self._idle.pop(conn, None)

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    @property
    def busy_connections(self) -> int:
        return len(self._busy)

    async def aclose(self) -> None:
        self._closed = True
        for conn in [*self._idle, *self._busy]:
            conn.close()
        self._idle.clear()
        self._busy.clear()


def _header_block(fields: dict[str, str]) -> bytes:
    block = "".join([f"{name}: {value}\r\n" for name, value in fields.items()])
    if block.count("\n") != len(fields) or block.count("\r") != len(fields):
        name = next(name for name, value in fields.items() if any(c in name or c in value for c in "\r\n"))
        raise ValueError(f"header {name!r} holds a line break")
    return block.encode("latin-1")
