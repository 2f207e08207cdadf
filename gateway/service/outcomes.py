"""How a request or an attempt ended, as the metrics, breakers, logs and retries classify it."""

from __future__ import annotations

import asyncio

from plugins.contract.errors import Overloaded, SwitchyardError, UpstreamError
from plugins.contract.protocol import Usage


def retry_kind(error: BaseException) -> str | None:
    """The error's kind when another target may be tried after it (connection error, timeout
    before the first byte, 5xx, 429, a full queue); None when it is the request's own fault."""
    if isinstance(error, Overloaded):
        return "overloaded"
    if isinstance(error, UpstreamError):
        if error.kind == "upstream_status" and (error.upstream_status or 500) < 500:
            return None
        return error.kind
    return None


def error_label(error: BaseException) -> str:
    """A short, bounded label for an error: the upstream kind, or the error class in snake case."""
    if isinstance(error, UpstreamError):
        return error.kind
    if isinstance(error, SwitchyardError):
        return error.code or _snake(type(error).__name__)
    return "internal"


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(name))


def outcome_of(error: BaseException | None) -> str:
    if error is None:
        return "ok"
    if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
        return "cancelled"
    if isinstance(error, SwitchyardError):
        return f"error:{type(error).__name__}"
    return "error:InternalError"


def check_usage(usage: Usage | None, backend: str) -> Usage:
    if usage is None:
        raise UpstreamError(f"Backend `{backend}` ended the response without usage.", kind="bad_gateway")
    if usage.prompt_tokens < 0 or usage.completion_tokens < 0:
        raise UpstreamError(f"Backend `{backend}` reported negative token counts.", kind="bad_gateway")
    return usage
