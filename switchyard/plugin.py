"""The stable import for Switchyard plugins:

    from switchyard.plugin import hookimpl, BackendType, Capabilities, TextDelta, Finish, Usage, ...

Everything a backend or routing plugin needs — the hook marker, the backend protocol and its
event types, the error types the gateway maps to HTTP, the registry types — under the
distribution's own name. `PLUGIN_API_VERSION` is (major, minor): a minor step adds (a new event a
backend may yield, an optional method), a major step changes something a plugin relies on; a
plugin can refuse to load with `assert PLUGIN_API_VERSION[0] == 1`.

`SamplingParams` is the old name of `Sampling` (a request's sampling knobs, `spec.sampling`),
kept as a deprecated alias for plugins written against it; new code imports `Sampling`.
"""

from __future__ import annotations

from pathlib import Path

import switchyard  # noqa: F401 - binds `plugins` to Switchyard's own package first
from plugins import hookimpl
from plugins.contract.config_types import BackendType, Route, Target
from plugins.contract.errors import (
    AuthenticationFailed,
    ConfigError,
    ContextLengthExceeded,
    InvalidRequest,
    ModelNotFound,
    NotFound,
    Overloaded,
    PermissionDenied,
    RequestTooLarge,
    SwitchyardError,
    UpstreamError,
)
from plugins.contract.protocol import (
    EXTENSIONS,
    Backend,
    Capabilities,
    EmbeddingBackend,
    EmbedRequest,
    EmbedResult,
    Event,
    Finish,
    FinishReason,
    ModelInfo,
    ReasoningDelta,
    Rendered,
    ReportsInFlight,
    ReportsServedBy,
    RequestSpec,
    Sampling,
    TextDelta,
    TokenizeRequest,
    TokenizeResult,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)

PLUGIN_API_VERSION = (1, 1)  # 1.1: `ReportsServedBy` (and `RequestSpec.replica` gone)

SamplingParams = Sampling  # deprecated: the old name of `Sampling` (see the module's docstring)


def model_dir(name_or_path: str) -> Path:
    """The checkpoint directory (config.json, *.safetensors, tokenizer.json) of a model
    Switchyard bundles, by name (converted once per machine into ~/.cache/switchyard by
    `switchyard models fetch NAME`; never downloaded here), or of a directory path.
    `ConfigError` when there is none."""
    from builtin_engine.model.store import ModelStoreError, resolve_model

    try:
        return resolve_model(name_or_path, fetch=False)
    except ModelStoreError as exc:
        raise ConfigError(str(exc)) from None


__all__ = [
    "EXTENSIONS", "PLUGIN_API_VERSION", "AuthenticationFailed", "Backend", "BackendType", "Capabilities",
    "ConfigError", "EmbedRequest", "EmbedResult", "EmbeddingBackend", "ContextLengthExceeded", "Event", "Finish",
    "FinishReason", "InvalidRequest", "ModelInfo", "ModelNotFound", "NotFound", "Overloaded", "PermissionDenied",
    "ReasoningDelta", "Rendered", "ReportsInFlight", "ReportsServedBy", "RequestSpec", "RequestTooLarge", "Route", "Sampling",
    "SamplingParams", "SwitchyardError", "Target", "TextDelta", "TokenLogprob", "TokenizeRequest", "TokenizeResult",
    "ToolCallDelta", "TopLogprob", "UpstreamError", "Usage", "hookimpl", "model_dir",
]
