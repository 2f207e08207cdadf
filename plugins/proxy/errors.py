"""An OpenAI-compatible upstream's error (HTTP status and body, whatever its shape, or an error
event in its stream) → the gateway's typed errors (`plugins.contract.errors`). Done once here for every
proxy backend (`plugins.proxy.backend`), whichever server (vLLM, llama.cpp, any OpenAI-compatible one)
sent it.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from plugins.contract.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    ModelNotFound,
    NotFound,
    RequestTooLarge,
    SwitchyardError,
    UpstreamError,
)
from plugins.contract.protocol import RequestSpec

_json_decode = msgspec.json.Decoder().decode
_json_encode = msgspec.json.Encoder().encode

_OVERFLOW = re.compile(
    r"maximum context length|context length|exceeds the available context size|context size|max_model_len"
    r"|context window|too many tokens|prompt is too long",
    re.IGNORECASE,
)
_OUTPUT_PARAMS = frozenset({"max_tokens", "max_completion_tokens", "n_predict"})
# the numbers in the servers' own wordings: vLLM ("maximum context length is 512 tokens. However,
# your prompt contains at least 513 input tokens"; "max_tokens=600 cannot be greater than
# max_model_len=512"), OpenAI ("your messages resulted in N tokens"; "you requested N tokens (P in
# the messages, C in the completion)"), Anthropic ("prompt is too long: N tokens > M maximum")
_CONTEXT = re.compile(r"maximum context length is (\d+) tokens|max_model_len=(\d+)|tokens? > (\d+) maximum")
_PROMPT = re.compile(r"(\d+) input tokens|messages resulted in (\d+) tokens|\((\d+) in the messages|too long: (\d+) tokens")
_ASKED = re.compile(r"max_tokens=(\d+)|(\d+) in the completion")


def _error_fields(payload: Any) -> tuple[str, str | None, str | None]:
    """(message, type, param) from an upstream error body, whatever its shape: OpenAI/vLLM/
    llama.cpp `{"error": {...}}`, vLLM's 401 `{"error": "Unauthorized"}`, FastAPI's
    `{"detail": ...}`, or plain text."""
    if isinstance(payload, dict):
        err = payload.get("error", payload)
        if isinstance(err, str):
            return err, None, None
        if isinstance(err, dict):
            message = err.get("message") or err.get("detail") or err.get("msg")
            if not isinstance(message, str):
                message = _json_encode(err).decode() if message is None else str(message)
            etype = err.get("type")
            param = err.get("param")
            return message, etype if isinstance(etype, str) else None, param if isinstance(param, str) else None
    if isinstance(payload, str):
        return payload, None, None
    return _json_encode(payload).decode(), None, None


def _clean_param(param: str | None) -> str | None:
    if not param:
        return None
    return param.removeprefix("body.")


def map_upstream_error(status: int, payload: Any, *, backend: str, spec: RequestSpec | None = None) -> SwitchyardError:
    """The one mapping of an upstream error (HTTP status + parsed body) onto the gateway's
    typed errors. The upstream's message is kept as it is."""
    message, etype, param = _error_fields(payload)
    message = message.strip() or f"Backend `{backend}` answered HTTP {status}."
    param = _clean_param(param)
    if etype == "exceed_context_size_error" or (400 <= status < 500 and status != 429 and _OVERFLOW.search(message)):
        if param in _OUTPUT_PARAMS:
            where = "max_tokens"
        else:
            where = "prompt" if spec is not None and spec.kind == "completion" else "messages"
        return ContextLengthExceeded(message, param=where, **_context_numbers(message, payload))
    if status == 429:
        return UpstreamError(message, kind="rate_limited", upstream_status=429)
    if status in (401, 403):
        # the gateway's own credentials for this upstream are wrong: never the client's fault
        return UpstreamError(f"Backend `{backend}` refused the gateway's credentials: {message}", kind="bad_gateway",
                             upstream_status=status)
    if status == 404:
        if spec is not None and (param == "model" or etype == "NotFoundError"):
            return ModelNotFound(spec.model)
        return NotFound(message)
    if status == 413:
        return RequestTooLarge(message)
    if 400 <= status < 500:
        return InvalidRequest(message, param=param)
    if status == 503:
        return UpstreamError(message, kind="unavailable", upstream_status=503)
    if status >= 500:
        return UpstreamError(message, kind="upstream_status", upstream_status=status)
    return UpstreamError(f"Backend `{backend}` answered HTTP {status}: {message}", kind="bad_gateway",
                         upstream_status=status)


def _first_number(pattern: re.Pattern[str], message: str) -> int | None:
    match = pattern.search(message)
    return None if match is None else int(next(g for g in match.groups() if g is not None))


def _context_numbers(message: str, payload: Any) -> dict[str, int | None]:
    """The prompt's tokens, the model's context and the output asked for, as far as the upstream's
    error tells them: llama.cpp's `n_prompt_tokens` / `n_ctx` fields, else its message. (vLLM
    counts an over-long prompt only up to `max_model_len + 1` tokens: its "at least N".)"""
    err = payload.get("error") if isinstance(payload, dict) else None
    fields = err if isinstance(err, dict) else {}
    prompt, context = fields.get("n_prompt_tokens"), fields.get("n_ctx")
    return {
        "prompt_tokens": prompt if isinstance(prompt, int) else _first_number(_PROMPT, message),
        "max_model_len": context if isinstance(context, int) else _first_number(_CONTEXT, message),
        "max_tokens": _first_number(_ASKED, message),
    }


def error_from_body(status: int, body: bytes, *, backend: str, spec: RequestSpec | None = None) -> SwitchyardError:
    try:
        payload: Any = _json_decode(body) if body else ""
    except msgspec.DecodeError:
        payload = body[:2000].decode("utf-8", errors="replace")
    return map_upstream_error(status, payload, backend=backend, spec=spec)


def status_of_error_event(payload: dict) -> int:
    """The HTTP status an error event in a stream stands for: its `error.code` when that is one, else 500."""
    err = payload.get("error")
    code = err.get("code") if isinstance(err, dict) else None
    if isinstance(code, int) and 400 <= code < 600:
        return code
    if isinstance(code, str) and code.isdigit():
        return int(code)
    return 500
