"""Streamed chat completions served in front of Litestar's per-request layers.

`POST /v1/chat/completions` with `"stream": true` is the gateway's hot path: at 256 streams
Litestar's router, exception middleware (and its wrapper around every `send`), signature model
and hook machinery were ~15% of the gateway's CPU per request, and uvicorn's ASGI request cycle
(scope, messages, `send` formatting each) another ~9%. Our server protocol (`gateway.http.exchange_protocol`) turns
such a request into a `ChatExchange`, and `StreamedChatFront.open_exchange` serves it with the
same pieces the Litestar handler uses (`chat_request_spec`, `gateway.http.common.answer_client`),
without a Litestar `Request` or an ASGI scope; the exchange writes the head `to_response` would
(the app's headers, the answer's, the content type:
tests/gateway/chat_api/test_streamed_chat_front.py compares the two), so headers, body, limits, metrics, log and traces are the same bytes and the
same records.

Everything else goes to the Litestar app untouched, through uvicorn's request cycle
(`ChatExchange.to_asgi`): other routes and methods, a body without a `Content-Length` or over
`max_body_bytes`, a draining gateway, a missing or unknown key, a body that does not decode or
validate, a non-streamed request (the body read so far is received by it, so its answer is
Litestar's own). An error once serving began (a 429 from the key's limits, a backend failing
before its first token) is handed to the Litestar handler to raise, so the exception handlers
write it as they write every other error.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Litestar, Request, Response
from litestar.handlers import HTTPRouteHandler
from litestar.handlers.http_handlers._utils import normalize_headers
from litestar.types import ASGIApp, Receive, Send

from gateway.chat_api import schemas as S
from gateway.chat_api.encode import collect, open_stream
from gateway.chat_api.exchange import ChatExchange, Opened
from gateway.chat_api.fields import CHAT_FIELDS
from gateway.chat_api.translate import chat_spec, check_chat
from gateway.http.common import CLIENT_CLOSED_REQUEST, ClientRequest, answer_client, authorize_key, take_watch
from gateway.ids import request_id_from
from gateway.keys.keyring import ClientKey, authorization_of
from gateway.service.admission import check_messages
from gateway.service.gateway import Gateway
from plugins.contract.protocol import RequestSpec

PATH = "/v1/chat/completions"
RAISE_IN_HANDLER = "switchyard.raise_in_handler"  # scope key: the error the Litestar handler raises
SSE_CONTENT_TYPE = (b"content-type", b"text/event-stream; charset=utf-8")
_DECODE = msgspec.json.Decoder(S.ChatCompletionRequest).decode


def chat_request_spec(gateway: Gateway, data: S.ChatCompletionRequest, key: ClientKey | None,
                      request_id: str) -> RequestSpec:
    """A chat completions body checked (the key's models, limits, extensions) and turned into
    the request spec, its `max_tokens` capped by the route."""
    authorize_key(key, data.model, gateway)
    check_messages(len(data.messages), gateway.config.server.max_messages)
    check_chat(data, max_n=gateway.config.server.max_n)
    CHAT_FIELDS.screen(data, gateway.metrics.ignored_fields)
    return chat_spec(data, request_id=request_id, upstream_model="", limits=gateway.limits_for(data.model))


class StreamedChatFront:
    """The ASGI app uvicorn serves (the Litestar app), and what our server protocol asks about a
    streamed chat request's exchange (`open_exchange`)."""

    path = PATH  # the route `open_exchange` is asked about (`POST` only)
    exchange = ChatExchange  # what the server protocol makes of such a request

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
        await self.app(scope, receive, send)  # type: ignore[arg-type]

    async def open_exchange(self, exchange: ChatExchange) -> Opened | None:
        """A stream served: its head's fields, its body and the client's disconnect watch, for
        the exchange to write; None: the exchange was answered through the Litestar app."""
        app = self.app
        gateway: Gateway | None = getattr(app.state, "gateway", None)
        headers = _headers(exchange.headers)
        length = headers.get("content-length", "")
        if (gateway is None or gateway.draining or not (length.isascii() and length.isdigit())
                or int(length) > self.max_body_bytes):
            await exchange.to_asgi(app)
            return None
        key: ClientKey | None = None
        keyring = app.state.keyring
        if keyring.enabled:
            key = keyring.authenticate(authorization_of(headers))
            if key is None:
                await exchange.to_asgi(app)
                return None
        raw = await exchange.read_body()
        spec = None
        if raw is not None and b'"stream"' in raw:
            request_id = request_id_from(headers)
            try:
                data = _DECODE(raw)
                if data.stream:
                    spec = chat_request_spec(gateway, data, key, request_id)
            except Exception:  # Litestar's handler answers it, from the body read
                spec = None
        if spec is None:
            await exchange.to_asgi(app)
            return None
        handed: dict[str, Any] = {}  # (where `accounted` hands the disconnect watch over)
        client = ClientRequest(request_id, key, headers, handed, exchange.receive)  # type: ignore[arg-type]
        try:
            spec, served, response_headers = await answer_client(client, gateway, spec, open_stream, collect)
        except Exception as exc:
            await exchange.to_asgi(self._in_handler(request_id, key, exc))
            return None
        if served is None:
            await exchange.to_asgi(self._in_handler(request_id, key, None))
            return None
        return self._fields(response_headers), served.body, take_watch(handed)  # type: ignore[return-value]

    def _in_handler(self, request_id: str, key: ClientKey | None, error: Exception | None) -> ASGIApp:
        """The answer Litestar's route handler gives: `error` raised there (as every error is
        answered), or the client gone (a 499, to nobody)."""
        app = self.app

        async def answer(scope: Any, receive: Receive, send: Send) -> None:
            scope["app"] = scope["litestar_app"] = app
            scope.setdefault("state", {}).update(request_id=request_id, client_key=key)
            scope["route_handler"] = handler = self._route_handler()
            scope["path_params"] = {}
            if error is not None:
                scope[RAISE_IN_HANDLER] = error
                await app(scope, receive, send)  # type: ignore[arg-type]
                return
            closed = Response(content=b"", status_code=CLIENT_CLOSED_REQUEST)
            asgi = await handler.to_response(app=app, data=closed, request=Request(scope, receive, send))
            await asgi(scope, receive, send)  # type: ignore[arg-type]

        return answer

    def _fields(self, headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
        """A streamed answer's header fields, in the order the route handler's `to_response`
        gives them (the app's, the answer's own, the content type)."""
        if self._app_headers is None:
            self._app_headers = normalize_headers(self._route_handler().resolve_response_headers())
        if self._app_headers:
            headers = {**self._app_headers, **headers}
        fields = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        fields.append(SSE_CONTENT_TYPE)
        return fields

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
