"""The engine's own error types. They carry meaning only; `plugins/builtin/backend.py` maps each onto a
`plugins.contract.errors` class (the engine never imports `plugins`)."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class UnsupportedModelError(EngineError):
    """A checkpoint directory the loader cannot serve; the message names what is missing or
    unsupported (a file, a config key, an architecture, a rope scaling type, a tensor)."""


class InvalidRequestError(EngineError):
    """A request the engine refuses before scheduling it (empty prompt, token id out of range,
    sampling parameter out of range). `param` names the request field at fault."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextLengthExceeded(InvalidRequestError):
    """Prompt plus requested output does not fit `max_model_len`. Raised by `add_request`,
    before anything is scheduled."""

    def __init__(self, *, num_prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> None:
        if max_tokens is None:
            message = (
                f"This model's maximum context length is {max_model_len} tokens. However, your "
                f"prompt is {num_prompt_tokens} tokens, which leaves no room for a completion."
            )
        else:
            message = (
                f"This model's maximum context length is {max_model_len} tokens. However, you "
                f"requested {num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the "
                f"prompt, {max_tokens} in the completion). Please reduce the length of the prompt "
                f"or the completion."
            )
        super().__init__(message, param="max_tokens" if max_tokens is not None else "messages")
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len


class QueueFull(EngineError):
    """The bounded waiting queue holds `max_waiting` requests already; retry later."""

    def __init__(self, max_waiting: int) -> None:
        super().__init__(f"The engine's waiting queue is full ({max_waiting} requests); retry later.")
        self.max_waiting = max_waiting


class EngineDeadError(EngineError):
    """The engine's step thread is not running (never started, shut down, or crashed)."""
