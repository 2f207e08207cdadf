"""Streamed chat completions served in front of Litestar's per-request layers.

`POST /v1/chat/completions` with `"stream": true` is the gateway's hot path: at 256 streams
Litestar's router, exception middleware (and its wrapper around every `send`), signature model
and hook machinery were ~15% of the gateway's CPU per request. `StreamedChatFront` serves such a
request with the same pieces the Litestar handler uses (`chat_request_spec`, `http_common`'s
`serve_client` and `send_sse`), without building a Litestar `Request` (its headers, state and
response objects were another ~5%), and writes the head `to_response` would (the app's headers, the answer's,
the content type: tests/gateway/test_streamed_chat_front.py compares the two), so headers, body,
limits, metrics, log and traces are the same bytes and the same records.

Everything else goes to the Litestar app untouched: other routes and methods, a body without a
`Content-Length` or over `max_body_bytes`, a draining gateway, a missing or unknown key, a body
that does not decode or validate, a non-streamed request (the body read so far is replayed to
it, so its answer is Litestar's own). An error once serving began (a 429 from the key's limits,
a backend failing before its first token) is handed to the Litestar handler to raise, so the
exception handlers write it as they write every other error.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Litestar, Request, Response
from litestar.handlers import HTTPRouteHandler
from litestar.handlers.http_handlers._utils import normalize_headers
from litestar.types import ASGIApp, Message, Receive, Send

from gateway import schemas as S
from gateway.auth import ClientKey, authorization_of
from gateway.chat_completions import collect, open_stream
from gateway.http_common import CLIENT_CLOSED_REQUEST, ClientRequest, authorize_key, send_sse, serve_client
from gateway.ids import request_id_from
from gateway.limits import cap_max_tokens, check_messages
from gateway.service import Gateway
from gateway.validation import chat_spec, check_chat
from plugins.protocol import RequestSpec

PATH = "/v1/chat/completions"
RAISE_IN_HANDLER = "switchyard.raise_in_handler"  # scope key: the error the Litestar handler raises
SSE_CONTENT_TYPE = (b"content-type", b"text/event-stream; charset=utf-8")
_DECODE = msgspec.json.Decoder(S.ChatCompletionRequest).decode


def chat_request_spec(gateway: Gateway, data: S.ChatCompletionRequest, key: ClientKey | None,
                      request_id: str) -> RequestSpec:
    """A chat completions body checked (the key's models, limits, extensions) and turned into
    the request spec, its `max_tokens` capped by the route."""
    authorize_key(key, data.model)
    check_messages(len(data.messages), gateway.config.server.max_messages)
    check_chat(data, max_n=gateway.config.server.max_n)
    spec = chat_spec(data, request_id=request_id, upstream_model="")
    if data.max_completion_tokens is not None:
        param, asked = "max_completion_tokens", data.max_completion_tokens
    else:
        param, asked = "max_tokens", data.max_tokens
    return cap_max_tokens(spec, gateway.limits_for(spec.model), param, asked)


class _Replay:
    """`receive` that first gives back the messages already read, then the server's own."""

    __slots__ = ("_messages", "_receive")

    def __init__(self, messages: list[Message], receive: Receive) -> None:
        self._messages = messages
        self._receive = receive

    async def __call__(self) -> Message:
        if self._messages:
            return self._messages.pop(0)
        return await self._receive()


class StreamedChatFront:
    """The ASGI app uvicorn serves: streamed chat completions here, the rest in `app`."""

    def __init__(self, app: Litestar, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self._handler: HTTPRouteHandler | None = None
        self._app_headers: dict[str, str] | None = None

    @property
    def state(self) -> Any:
        """The Litestar app's state (where the drain on SIGTERM finds the gateway)."""
        return self.app.state

    async def __call__(self, scope: Any, receive: Receive, send: Send) -> None:
        # one coroutine, no second level for the chat route: each wake-up of a stream's task
        # (every upstream read) resumes through every level of its awaits
        app = self.app
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await app(scope, receive, send)  # type: ignore[arg-type]
            return
        gateway: Gateway | None = getattr(app.state, "gateway", None)
        headers = _headers(scope["headers"])
        length = headers.get("content-length", "")
        if (gateway is None or gateway.draining or not (length.isascii() and length.isdigit())
                or int(length) > self.max_body_bytes):
            await app(scope, receive, send)
            return
        key: ClientKey | None = None
        keyring = app.state.keyring
        if keyring.enabled:
            key = keyring.authenticate(authorization_of(headers))
            if key is None:
                await app(scope, receive, send)
                return
        messages: list[Message] = []
        parts: list[bytes] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        server_receive, receive = receive, _Replay(messages, receive)
        raw = b"".join(parts)
        spec = None
        if messages[-1]["type"] == "http.request" and b'"stream"' in raw:
            request_id = request_id_from(headers)
            try:
                data = _DECODE(raw)
                if data.stream:
                    spec = chat_request_spec(gateway, data, key, request_id)
            except Exception:  # Litestar's handler answers it, from the replayed body
                spec = None
        if spec is None:
            await app(scope, receive, send)
            return
        messages.clear()  # the body is read: what follows (a disconnect) comes from the server
        receive = server_receive  # (so the disconnect watch sees the server's own request cycle)
        client = ClientRequest(request_id, key, headers, scope, receive)
        try:
            spec, served, response_headers = await serve_client(client, gateway, spec, open_stream, collect)
        except Exception as exc:
            scope[RAISE_IN_HANDLER] = exc
            self._to_litestar(scope, request_id, key)
            await app(scope, receive, send)
            return
        if served is not None:
            await send_sse(scope, receive, send, self._start(response_headers), served.body)
            return
        self._to_litestar(scope, request_id, key)  # the client left: 499, as Litestar's handler answers it
        closed = Response(content=b"", status_code=CLIENT_CLOSED_REQUEST)
        asgi: ASGIApp = await scope["route_handler"].to_response(app=app, data=closed, request=Request(scope, receive, send))
        await asgi(scope, receive, send)

    def _to_litestar(self, scope: Any, request_id: str, key: ClientKey | None) -> None:
        """The scope as the Litestar app and its route handler see it, with the request's id
        and key in its state as Litestar's handlers put them there."""
        scope["app"] = scope["litestar_app"] = self.app
        scope.setdefault("state", {}).update(request_id=request_id, client_key=key)
        scope["route_handler"] = self._route_handler()
        scope["path_params"] = {}

    def _start(self, headers: dict[str, str]) -> dict[str, Any]:
        """The `http.response.start` of a streamed answer: the headers, in order, that the route
        handler's `to_response` gives it (the app's, the answer's own, the content type)."""
        if self._app_headers is None:
            self._app_headers = normalize_headers(self._route_handler().resolve_response_headers())
        if self._app_headers:
            headers = {**self._app_headers, **headers}
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        raw.append(SSE_CONTENT_TYPE)
        return {"type": "http.response.start", "status": 200, "headers": raw}

    def _route_handler(self) -> HTTPRouteHandler:
        if self._handler is None:
            route = next(r for r in self.app.routes if r.path == PATH)
            self._handler = route.route_handler_map["POST"][0]  # type: ignore[union-attr]
        return self._handler


def _headers(raw_headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The request's headers by their (lower-case, as ASGI gives them) names, the first of a
    repeated one, as Litestar's `Headers.get` reads them."""
    headers: dict[str, str] = {}
    for name, value in raw_headers:
        key = name.decode("latin-1")
        if key not in headers:
            headers[key] = value.decode("latin-1")
    return headers
