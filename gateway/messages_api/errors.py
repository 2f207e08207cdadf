"""Anthropic's error object, `{"type": "error", "error": {"type", "message"}}`, for a status the
gateway's one error table (`gateway.errors`) chose: every error on the Messages paths, answered
or sent as a stream's `error` event, has this shape.

A context overflow is worded as Anthropic's API words it, because Claude Code acts on the words
(`in_anthropic_words`): `prompt is too long: N tokens > M maximum` starts its auto-compaction,
and `input length and max_tokens exceed context limit: P + T > C, ...` (`max_tokens` in
backticks) makes it send the request again with `max_tokens` lowered to what fits.
"""

from __future__ import annotations

from gateway.messages_api import schemas as M
from plugins.contract.errors import ContextLengthExceeded

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


def overflow_message(error: ContextLengthExceeded, max_tokens: int | None, said: str | None = None) -> str:
    """Anthropic's words for a prompt (and `max_tokens`: the backend's figure, else the request's)
    that does not fit the model's context; where the backend could not tell the numbers, its own
    words (`said`: as the client may read them, redacted) after `prompt is too long: `."""
    prompt, context = error.prompt_tokens, error.max_model_len
    if prompt is None or context is None:
        said = error.message if said is None else said
        return said if said.startswith("prompt is too long") else f"prompt is too long: {said}"
    if prompt > context:
        return f"prompt is too long: {prompt} tokens > {context} maximum"
    max_tokens = error.max_tokens if error.max_tokens is not None else max_tokens
    if max_tokens is not None:
        return (f"input length and `max_tokens` exceed context limit: {prompt} + {max_tokens} > {context}, "
                "decrease input length or `max_tokens` and try again")
    return f"prompt is too long: {prompt} tokens > {context - 1} maximum"  # no room left for one token


def in_anthropic_words(error: ContextLengthExceeded, max_tokens: int | None) -> ContextLengthExceeded:
    """The same error (status, param), its message in Anthropic's words and final: the numbers
    stay on `error`, so that nothing words the message again from them."""
    worded = ContextLengthExceeded(overflow_message(error, max_tokens), param=error.param)
    worded.__cause__ = error
    return worded
