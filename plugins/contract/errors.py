"""The one error hierarchy. It carries meaning, never HTTP: the gateway maps each class to a
status and an OpenAI error object in exactly one table (`gateway/errors.py`).

Backends raise these from `generate()` (before or after the first event); proxy plugins map
upstream error bodies onto them once, in the proxy core.
"""

from __future__ import annotations


class SwitchyardError(Exception):
    """Base class. `param` names the request field at fault, when there is one."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InvalidRequest(SwitchyardError):
    """The request is malformed, out of range, or asks for something the backend cannot do."""


class ContextLengthExceeded(InvalidRequest):
    """Prompt plus requested output does not fit the model's context. `prompt_tokens` and
    `max_model_len`, where the backend can tell them, let each wire API word it as its clients
    expect (Anthropic's `prompt is too long: N tokens > M maximum`) and a route that clamps
    `max_tokens` fit the output into the context left; `max_tokens`: the output the request asked
    for, where the backend tells it."""

    def __init__(self, message: str, *, param: str | None = "messages", prompt_tokens: int | None = None,
                 max_model_len: int | None = None, max_tokens: int | None = None) -> None:
        super().__init__(message, param=param, code="context_length_exceeded")
        self.prompt_tokens = prompt_tokens
        self.max_model_len = max_model_len
        self.max_tokens = max_tokens


class AuthenticationFailed(SwitchyardError):
    """No API key, or an unknown one."""


class PermissionDenied(SwitchyardError):
    """A known API key that may not use this route."""


class ModelNotFound(SwitchyardError):
    """No backend or route serves the requested model name."""

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist.", param="model", code="model_not_found")
        self.model = model


class NotFound(SwitchyardError):
    """A resource other than a model does not exist."""


class RequestTooLarge(SwitchyardError):
    """The request body is over the configured limit."""


class Overloaded(SwitchyardError):
    """A bounded queue is full; the client should retry later."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message, code="queue_full")
        self.retry_after_s = retry_after_s


class UpstreamError(SwitchyardError):
    """A backend failed. `kind` says how, so the gateway can pick 502, 503 or 504, and routing
    can decide whether another target may be tried."""

    def __init__(
        self,
        message: str,
        *,
        kind: str = "bad_gateway",
        upstream_status: int | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message, param=param, code=code)
        if kind not in UPSTREAM_ERROR_KINDS:
            raise ValueError(f"unknown upstream error kind {kind!r}")
        self.kind = kind
        self.upstream_status = upstream_status


# bad_gateway: unreachable or unintelligible upstream; unavailable: upstream says it cannot serve
# (or it is unhealthy); timeout: no answer in time; rate_limited: upstream 429.
UPSTREAM_ERROR_KINDS = frozenset({"bad_gateway", "unavailable", "timeout", "rate_limited", "upstream_status"})
# the kinds that say the backend (or replica) is unwell: they count towards its circuit breaker.
# (429 and a full queue say "busy", not "broken": they are retried elsewhere but open no breaker.)
BREAKER_KINDS = UPSTREAM_ERROR_KINDS - {"rate_limited"}


class ConfigError(SwitchyardError):
    """`plugins.toml` is invalid; the message names the file and the key."""
