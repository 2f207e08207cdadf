"""The one table that turns `plugins.contract.errors` into HTTP: status, OpenAI error type, headers.

Everything the gateway answers with an error goes through `error_payload`, whether as a JSON
response or as a `data: {"error": ...}` event inside a stream that has already begun. On
Anthropic's paths (`/v1/messages...`) the same status goes out in Anthropic's shape,
`{"type": "error", "error": {"type", "message"}}` (`gateway.messages_api.errors`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, NotFoundException
from litestar.exceptions import MethodNotAllowedException
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

from gateway import messages_api
from gateway.ids import request_id_from
from gateway.keys import BudgetExhausted, KeyLimitExceeded, StateUnavailable
from gateway.service.admission import DeadlineExceeded, ShuttingDown
from gateway.messages_api.errors import error_response as anthropic_error
from gateway.chat_api.schemas import ErrorBody, ErrorResponse
from plugins.contract import errors as E

log = logging.getLogger("switchyard.gateway")

# (status, OpenAI error type) per error class; the most specific class wins (MRO order).
ERROR_TABLE: dict[type[E.SwitchyardError], tuple[int, str]] = {
    E.InvalidRequest: (400, "invalid_request_error"),
    E.AuthenticationFailed: (401, "authentication_error"),
    E.PermissionDenied: (403, "permission_error"),
    E.ModelNotFound: (404, "invalid_request_error"),
    E.NotFound: (404, "not_found_error"),
    E.RequestTooLarge: (413, "invalid_request_error"),
    E.Overloaded: (429, "rate_limit_error"),
    BudgetExhausted: (429, "insufficient_quota"),
    StateUnavailable: (503, "service_unavailable_error"),
    ShuttingDown: (503, "service_unavailable_error"),
    DeadlineExceeded: (504, "timeout_error"),
    E.ConfigError: (500, "server_error"),
    E.UpstreamError: (502, "upstream_error"),
    E.SwitchyardError: (500, "server_error"),
}

UPSTREAM_STATUS = {"bad_gateway": 502, "unavailable": 503, "timeout": 504, "rate_limited": 429}


def status_and_type(error: E.SwitchyardError) -> tuple[int, str]:
    if isinstance(error, E.UpstreamError):
        if error.kind == "upstream_status" and error.upstream_status:
            return error.upstream_status, _type_for_status(error.upstream_status)
        status = UPSTREAM_STATUS[error.kind]
        return status, _type_for_status(status)
    for cls in type(error).__mro__:
        if cls in ERROR_TABLE:
            return ERROR_TABLE[cls]
    return 500, "server_error"


def _type_for_status(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    if 400 <= status < 500:
        return "invalid_request_error"
    return "upstream_error" if status in (502, 503, 504) else "server_error"


def error_payload(error: E.SwitchyardError, redact: Callable[[str], str] | None = None) -> tuple[int, ErrorResponse]:
    """The status and the OpenAI error object; `redact` scrubs secrets from the message (an
    upstream's message is kept as it is, and an upstream may echo the key it was sent)."""
    status, kind = status_and_type(error)
    message = error.message if redact is None else redact(error.message)
    body = ErrorBody(message=message, type=kind, param=error.param, code=error.code)
    return status, ErrorResponse(error=body)


_AT_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_UNKNOWN_FIELD = re.compile(r"Object contains unknown field `(?P<field>[^`]+)`")
_MISSING_FIELD = re.compile(r"Object missing required field `(?P<field>[^`]+)`")


def from_decode_error(exc: msgspec.DecodeError) -> E.InvalidRequest:
    """A msgspec decode/validation failure as a 400 naming the offending field."""
    text = str(exc)
    if not isinstance(exc, msgspec.ValidationError):
        return E.InvalidRequest(f"The request body is not valid JSON: {text}")
    path = ""
    match = _AT_PATH.search(text)
    if match:
        # msgspec writes a dict value's position as `[...]`; the param is the dict itself
        path = match["path"].lstrip(".").replace("[...]", "")
        text = text[: match.start()]
    unknown = _UNKNOWN_FIELD.search(text)
    if unknown:
        param = f"{path}.{unknown['field']}" if path else unknown["field"]
        return E.InvalidRequest(f"Unrecognized request argument supplied: {param}", param=param)
    missing = _MISSING_FIELD.search(text)
    if missing:
        param = f"{path}.{missing['field']}" if path else missing["field"]
        return E.InvalidRequest(f"Missing required argument: `{param}`.", param=param)
    if not path:
        return E.InvalidRequest(f"Invalid request body: {text}")
    return E.InvalidRequest(f"Invalid value for `{path}`: {text}", param=path)


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
