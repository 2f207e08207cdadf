"""The hop from a proxy backend to its servers: `Upstream` owns the replicas (`plugins.fleet`,
one `plugins.transport.http1.Pool` of keep-alive connections each), the three timeouts, and
the count of upstream responses held open; `BodyPieces` reads one response body under them.

Timeouts: connect; first byte (from sending the request until the first body bytes); idle
(between two body pieces). A streamed request goes through `open` (a replica the fleet picks,
the next one after a failure before the first byte) and `release`; a request that is no stream
(catalogue, tokens, embeddings) through `request_json`. Transport failures and upstream error
bodies come out as `plugins.contract.errors` types (`transport_error`, `plugins.proxy.errors`).

`api_key` goes only into this upstream's pools (`Authorization: Bearer`) and to a server the
backend starts itself; redirects are not followed.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

import msgspec

from plugins.contract.errors import ConfigError, SwitchyardError, UpstreamError
from plugins.contract.protocol import RequestSpec
from plugins.fleet.fleet import Fleet
from plugins.fleet.replica import Replica
from plugins.proxy.errors import error_from_body
from plugins.proxy.options import ProxyOptions
from plugins.transport import http1

log = logging.getLogger("switchyard.proxy")

MAX_ERROR_BODY = 1 << 20  # bytes of an upstream error body read before giving up on the rest
TRACE_HEADERS = ("traceparent", "tracestate")  # sent on to the upstream when the client headers have them

_json_decode = msgspec.json.Decoder().decode
_json_encode = msgspec.json.Encoder().encode


def upstream_ids(request_id: str, client_headers: dict[str, str]) -> dict[str, str]:
    """What identifies a request upstream: its id, and the W3C trace context the gateway's
    tracing put in `client_headers`."""
    ids = {"x-request-id": request_id}
    for name in TRACE_HEADERS:
        if name in client_headers:
            ids[name] = client_headers[name]
    return ids


class Upstream:
    """The servers behind backend `name`: one, or a fleet of replicas (`options`)."""

    def __init__(self, name: str, options: ProxyOptions, *, load_sources: tuple[str, ...], health_path: str) -> None:
        self.name = name
        self.options = options
        self.timeouts = options.timeouts
        self.fleet = Fleet.from_options(name, options, make_pool=self._make_pool, load_sources=load_sources,
                                        health_path=health_path)
        self.open_streams = 0  # responses `open` returned that are not released yet

    def api_key(self) -> str | None:
        """The key this upstream takes (`api_key`, else the variable `api_key_env` names)."""
        if self.options.api_key:
            return self.options.api_key
        if self.options.api_key_env:
            return os.environ.get(self.options.api_key_env) or None
        return None

    def _make_pool(self, url: str) -> http1.Pool:
        t, p = self.timeouts, self.options.pool
        headers = {"accept-encoding": "identity", "user-agent": "switchyard-proxy", **self.options.headers}
        key = self.api_key()
        if key:
            headers["authorization"] = f"Bearer {key}"
        try:
            return http1.Pool(url, headers=headers, max_connections=p.max_connections,
                              max_idle=p.max_keepalive_connections, idle_expiry_s=p.keepalive_expiry_s,
                              connect_timeout_s=t.connect_s, acquire_timeout_s=p.acquire_timeout_s)
        except ValueError as exc:
            raise ConfigError(f"backend `{self.name}`: replica {url}: {exc}") from None

    # -- plain JSON requests (catalogue, tokens, embeddings) ---------------------------------

    async def request_json(self, method: str, path: str, body: Any = None, *, spec: RequestSpec | None = None,
                           headers: dict[str, str] | None = None) -> Any:
        """A request that is no stream (catalogue, tokens, embeddings) to the least loaded replica
        that can take it, with `headers` besides the content type."""
        t = self.timeouts
        replica = self.fleet.any_replica()
        deadline = asyncio.get_running_loop().time() + t.first_byte_s
        try:
            response = await replica.pool.request(
                method, path, b"" if body is None else _json_encode(body),
                {"content-type": "application/json", **(headers or {})} if body is not None else headers, deadline=deadline,
            )
            try:
                content = await response.read(None if response.status < 400 else MAX_ERROR_BODY, deadline)
            finally:
                await response.aclose()
        except TimeoutError:
            raise UpstreamError(f"Backend `{self.name}` did not answer {method} {path} within {t.first_byte_s:g} s.",
                                kind="timeout") from None
        except http1.HTTPError as exc:
            raise self.transport_error(exc, replica.url) from None
        if response.status >= 400:
            raise error_from_body(response.status, content[:MAX_ERROR_BODY], backend=self.name, spec=spec)
        try:
            return _json_decode(content) if content else None
        except msgspec.DecodeError:
            raise UpstreamError(f"Backend `{self.name}` answered {path} with something that is not JSON.",
                                kind="bad_gateway") from None

    async def get_json(self, path: str) -> dict[str, Any]:
        """GET `path`; its JSON object ({} for anything else)."""
        body = await self.request_json("GET", path)
        return body if isinstance(body, dict) else {}

    def transport_error(self, exc: BaseException, url: str = "", *, after_start: bool = False) -> UpstreamError:
        """A connection's failure (`http1.HTTPError`) as the error the gateway answers with;
        `after_start`: the response had begun."""
        t = self.timeouts
        if isinstance(exc, http1.ConnectTimeout):
            return UpstreamError(f"Backend `{self.name}` ({url}) did not accept a connection within "
                                 f"{t.connect_s:g} s.", kind="timeout")
        if isinstance(exc, http1.PoolTimeout):
            return UpstreamError(f"Backend `{self.name}`: all {self.options.pool.max_connections} connections are busy.",
                                 kind="unavailable")
        if isinstance(exc, http1.ConnectError):
            return UpstreamError(f"Backend `{self.name}` ({url}) is unreachable: {exc}", kind="bad_gateway")
        what = "broke the stream" if after_start else "failed"
        return UpstreamError(f"Backend `{self.name}` {what}: {type(exc).__name__}: {exc}", kind="bad_gateway")

    # -- streamed requests -------------------------------------------------------------------

    async def open(self, spec: RequestSpec, path: str, content: bytes, headers: dict[str, str],
                   tried: list[Replica]) -> tuple[Replica, http1.Response, float]:
        """POST to the replica the fleet picks and wait for a 200 response head; the replica,
        the response and the first-byte deadline. A failure there that another replica may not
        share (unreachable, 5xx, 429, no answer in time) is tried on the next replica, up to
        `replica_attempts`. Each replica is appended to `tried` as it is tried, so the caller
        knows which one served, or failed last. The response counts as open until `release`."""
        loop = asyncio.get_running_loop()
        while True:
            replica = self.fleet.choose(spec, tried)
            tried.append(replica)
            deadline = loop.time() + self.timeouts.first_byte_s
            try:
                response = await self._send(replica, path, content, headers, deadline)
                if response.status != 200:
                    try:
                        raw = await self.read_capped(response, deadline)
                    finally:
                        await response.aclose()
                    raise error_from_body(response.status, raw, backend=self.name, spec=spec)
            except BaseException as exc:
                self.fleet.finished(replica, spec, exc, before_first_byte=True)
                if isinstance(exc, SwitchyardError) and self.fleet.can_retry(exc, tried):
                    log.info("backend %s: replica %s failed before the first byte (%s); trying another replica",
                             self.name, replica.url, exc.message)
                    continue
                raise
            self.open_streams += 1
            return replica, response, deadline

    async def _send(self, replica: Replica, path: str, content: bytes, headers: dict[str, str],
                    deadline: float) -> http1.Response:
        """POST and wait for the response head, under the first-byte deadline."""
        try:
            response = await replica.pool.request("POST", path, content, headers, deadline=deadline)
        except TimeoutError:
            raise UpstreamError(f"Backend `{self.name}` ({replica.url}) sent no response within "
                                f"{self.timeouts.first_byte_s:g} s.", kind="timeout") from None
        except http1.HTTPError as exc:
            raise self.transport_error(exc, replica.url) from None
        log.debug("backend %s: POST %s%s -> %d", self.name, replica.url, path, response.status)
        return response

    async def release(self, replica: Replica, response: http1.Response, spec: RequestSpec,
                      error: BaseException | None) -> None:
        """Close a response `open` returned (which cancels the request upstream if it has not
        ended) and tell the fleet how the request went (`error` None: it completed)."""
        try:
            await response.aclose()
        finally:
            self.open_streams -= 1
            self.fleet.finished(replica, spec, error)

    async def read_capped(self, response: http1.Response, deadline: float, limit: int | None = MAX_ERROR_BODY) -> bytes:
        """The body, up to about `limit` bytes (None: all of it); what arrived before a failed
        read, or the failure when nothing did."""
        chunks: list[bytes] = []
        size = 0
        body = BodyPieces(self, response, deadline)
        try:
            while (piece := await body.next()) is not None:
                chunks.append(piece)
                size += len(piece)
                if limit is not None and size >= limit:
                    break
        except UpstreamError:
            if not chunks:
                raise
        return b"".join(chunks)

    async def drain(self, response: http1.Response) -> None:
        """Read what is left of a body whose stream already ended (so the connection can be
        kept), for at most a second."""
        try:
            await response.read(MAX_ERROR_BODY, asyncio.get_running_loop().time() + 1.0)
        except (TimeoutError, http1.HTTPError):
            pass


class BodyPieces:
    """A response body's bytes as they arrive (no re-chunking): the first piece under the
    first-byte deadline, every later one under the upstream's idle timeout; a failed read is the
    upstream's `UpstreamError` (no first piece in time, a stall mid-body, or the connection's
    failure)."""

    __slots__ = ("_upstream", "_response", "_when", "_first", "_clock", "_idle_s")

    def __init__(self, upstream: Upstream, response: http1.Response, deadline: float) -> None:
        self._upstream = upstream
        self._response = response
        self._when = deadline  # loop time by which the next piece must arrive
        self._first = True
        self._clock = asyncio.get_running_loop().time
        self._idle_s = upstream.timeouts.idle_s

    async def next(self, on_piece: Callable[[bytes], bool] | None = None) -> bytes | None:
        """The bytes that arrived since the last call; None at the end of the body. `on_piece`:
        see `http1.Response.next_piece` (b"" when it handed control back); it calls `arrived()`
        for every piece it is given."""
        try:
            piece = await self._response.next_piece(self._when, on_piece)
        except (TimeoutError, http1.HTTPError) as exc:
            raise self._error(exc) from None
        if piece:
            self.arrived()
        return piece

    def arrived(self) -> None:
        """A piece arrived: the next one is due within the idle timeout (also for the wait in
        progress, when it was pushed)."""
        self._first = False
        self._when = self._clock() + self._idle_s
        self._response.move_deadline(self._when)

    def _error(self, exc: TimeoutError | http1.HTTPError) -> UpstreamError:
        upstream = self._upstream
        if isinstance(exc, http1.HTTPError):
            return upstream.transport_error(exc, after_start=True)
        t = upstream.timeouts
        if self._first:
            return UpstreamError(f"Backend `{upstream.name}` sent no data within {t.first_byte_s:g} s.", kind="timeout")
        return UpstreamError(f"Backend `{upstream.name}` stalled for {t.idle_s:g} s in the middle of a response.",
                             kind="timeout")
