"""The app's exception handlers: every error answered as JSON, in the shape of the API the
request spoke — OpenAI's `{"error": {...}}` (`gateway.errors`), or on Anthropic's paths
(`/v1/messages...`) Anthropic's `{"type": "error", "error": {"type", "message"}}`
(`gateway.messages_api.errors`) — with the status and headers the error calls for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, MethodNotAllowedException, NotFoundException
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

from gateway import messages_api
from gateway.errors import ErrorResponse, KeyLimitExceeded, ShuttingDown, error_payload
from gateway.ids import request_id_from
from gateway.messages_api.errors import error_response as anthropic_error
from plugins.contract import errors as E

log = logging.getLogger("switchyard.gateway")


def request_id_of(request: Request) -> str:
    """The request's id: set by `before_request`, or — for errors raised before it ran (no
    route, body unreadable) — the client's `x-request-id`, or a new one."""
    state = request.scope.setdefault("state", {})
    request_id = state.get("request_id")
    if not request_id:
        request_id = request_id_from(request.headers)
        state["request_id"] = request_id
    return request_id


def _count(request: Request, error_type: str) -> None:
    """`switchyard_errors_total{type}`: every error answered (the gateway exists once the
    lifespan has run; errors before that are not counted)."""
    gateway = getattr(request.app.state, "gateway", None)
    if gateway is not None:
        gateway.metrics.errors.labels(error_type).inc()


def _redactor(request: Request) -> Callable[[str], str] | None:
    gateway = getattr(request.app.state, "gateway", None)
    return None if gateway is None else gateway.redact


def _body(request: Request, status: int, payload: ErrorResponse) -> bytes:
    """The error object in the shape of the API the request spoke."""
    if request.url.path.startswith(messages_api.PATH_PREFIX):
        return msgspec.json.encode(anthropic_error(status, payload.error.message))
    return msgspec.json.encode(payload)


def _response(error: E.SwitchyardError, request: Request, status: int | None = None) -> Response:
    code, payload = error_payload(error, _redactor(request))
    _count(request, payload.error.type)
    status = code if status is None else status
    headers = {"x-request-id": request_id_of(request)}
    if isinstance(error, E.Overloaded) and error.retry_after_s is not None:
        headers["retry-after"] = str(max(1, round(error.retry_after_s)))
    if isinstance(error, KeyLimitExceeded):
        headers.update(error.headers)
    if isinstance(error, E.AuthenticationFailed):
        headers["www-authenticate"] = "Bearer"
    if isinstance(error, ShuttingDown):
        headers["connection"] = "close"
    return Response(content=_body(request, status, payload), status_code=status, media_type="application/json", headers=headers)


def handle_switchyard_error(request: Request, exc: E.SwitchyardError) -> Response:
    return _response(exc, request)


def handle_http_exception(request: Request, exc: HTTPException) -> Response:
    """Litestar's own 404/405/413s, in the OpenAI shape."""
    if isinstance(exc, NotFoundException):
        error: E.SwitchyardError = E.NotFound(f"Route {request.method} {request.url.path} not found.")
    elif isinstance(exc, MethodNotAllowedException):
        error = E.InvalidRequest(f"Method {request.method} not allowed for {request.url.path}.")
        return _response(error, request, status=405)
    elif exc.status_code == 413:
        error = E.RequestTooLarge("Request body too large.")
    elif exc.status_code < 500:
        return _response(E.InvalidRequest(exc.detail), request, status=exc.status_code)
    else:
        return handle_internal_error(request, exc)
    return _response(error, request)


def handle_internal_error(request: Request, exc: Exception) -> Response:
    """A real bug: log the traceback, answer 500 with the request id and no traceback."""
    request_id = request_id_of(request)
    log.exception("internal error in request %s", request_id)
    error = E.SwitchyardError(f"Internal server error (request id {request_id}).")
    status, payload = error_payload(error)
    _count(request, payload.error.type)
    body = _body(request, HTTP_500_INTERNAL_SERVER_ERROR, payload)
    return Response(content=body, status_code=HTTP_500_INTERNAL_SERVER_ERROR, media_type="application/json", headers={"x-request-id": request_id})


EXCEPTION_HANDLERS = {
    E.SwitchyardError: handle_switchyard_error,
    HTTPException: handle_http_exception,
    Exception: handle_internal_error,
}
