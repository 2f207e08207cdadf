"""The errors the gateway raises itself, and the one table that turns every error
(`plugins.contract.errors` and these) into a status and an OpenAI error object.

Everything the gateway answers with an error goes through `error_payload`, whether as a JSON
response (`gateway.error_handlers`) or as an error event inside a stream that has already begun
(each wire API's encoder). On Anthropic's paths the same status goes out in Anthropic's shape
(`gateway.messages_api.errors`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

import msgspec

from plugins.contract import errors as E

RETRY_AFTER_S = 1.0  # what a refusal without a better estimate tells the client to wait


class DeadlineExceeded(E.SwitchyardError):
    """The request ran past its route's `request_timeout_s` (504)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"The request did not complete within its deadline of {timeout_s:g} s.", code="request_timeout")


class ShuttingDown(E.SwitchyardError):
    """The server is draining: no new requests, and what is still running at the end of the
    drain period is ended (503)."""

    def __init__(self, message: str = "The server is shutting down; retry on another replica.") -> None:
        super().__init__(message, code="server_shutting_down")


class KeyLimitExceeded(E.Overloaded):
    """A client key is over one of its limits (429, with `Retry-After` and `x-ratelimit-*`)."""

    def __init__(self, message: str, *, retry_after_s: float | None, headers: dict[str, str], code: str = "rate_limit_exceeded") -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.code = code
        self.headers = headers


class BudgetExhausted(KeyLimitExceeded):
    """A client key has used its token budget for the period (429 `insufficient_quota`)."""


class QueueShed(E.Overloaded):
    """A request a full backend's queue (`gateway.flow_control`) will not serve (429 with
    `Retry-After`; a `fallback` route tries its next target): the queue is full, the request is
    predicted to start later than its route's `ttft_slo_ms`, or it waited `queue_timeout_s`
    without a slot."""

    CODES = {"queue_full": "queue_full", "slo": "queue_wait_over_slo", "timeout": "queue_timeout"}

    def __init__(self, message: str, *, reason: Literal["queue_full", "slo", "timeout"], retry_after_s: float) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.reason = reason
        self.code = self.CODES[reason]


class StateUnavailable(E.SwitchyardError):
    """The limits' state store cannot be reached and `on_state_error = "deny"` (503)."""


class ErrorBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """OpenAI's error object, the gateway's own shape on every path but Anthropic's."""

    error: ErrorBody


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
    message = context_message(error) if isinstance(error, E.ContextLengthExceeded) else error.message
    message = message if redact is None else redact(message)
    body = ErrorBody(message=message, type=kind, param=error.param, code=error.code)
    return status, ErrorResponse(error=body)


def context_message(error: E.ContextLengthExceeded) -> str:
    """OpenAI's own wording of a context overflow (clients and people know it), from the numbers
    the backend told; its own message where it told too few. Legacy completions (`param`
    "prompt") have their older wording."""
    limit, prompt, asked = error.max_model_len, error.prompt_tokens, error.max_tokens
    if limit is None or prompt is None:
        return error.message
    completion = 0 if asked is None or prompt >= limit else asked
    if error.param == "prompt":
        return (f"This model's maximum context length is {limit} tokens, however you requested {prompt + completion} "
                f"tokens ({prompt} in your prompt; {completion} for the completion). Please reduce your prompt; "
                "or completion length.")
    if not completion:
        return (f"This model's maximum context length is {limit} tokens. However, your messages resulted in {prompt} "
                "tokens. Please reduce the length of the messages.")
    return (f"This model's maximum context length is {limit} tokens. However, you requested {prompt + completion} "
            f"tokens ({prompt} in the messages, {completion} in the completion). Please reduce the length of the "
            "messages or completion.")


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
