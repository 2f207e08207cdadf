"""Anthropic's error object, `{"type": "error", "error": {"type", "message"}}`, for a status the
gateway's one error table (`gateway.errors`) chose: every error on the Messages paths, answered
or sent as a stream's `error` event, has this shape."""

from __future__ import annotations

from gateway.messages_api import schemas as M

# Anthropic's error type per HTTP status (https://docs.anthropic.com/en/api/errors)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_response(status: int, message: str) -> M.ErrorResponse:
    kind = ERROR_TYPES.get(status) or ("invalid_request_error" if 400 <= status < 500 else "api_error")
    return M.ErrorResponse(error=M.ErrorObject(type=kind, message=message))
