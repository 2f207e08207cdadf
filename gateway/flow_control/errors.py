"""What a full backend answers. A `QueueShed` is an `Overloaded`: the gateway's one error table
(`gateway/errors.py`) already turns it into 429 `rate_limit_error` with `Retry-After`, in the
OpenAI shape or, on `/v1/messages`, Anthropic's — and a `fallback` route tries its next target."""

from __future__ import annotations

from typing import Literal

from plugins.errors import Overloaded

ShedReason = Literal["queue_full", "slo", "timeout"]

CODES: dict[str, str] = {"queue_full": "queue_full", "slo": "queue_wait_over_slo", "timeout": "queue_timeout"}


class QueueShed(Overloaded):
    """A request the backend's queue will not serve: full, predicted to start later than its
    route's `ttft_slo_ms`, or waited `queue_timeout_s` without a slot."""

    def __init__(self, message: str, *, reason: ShedReason, retry_after_s: float) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.code = CODES[reason]
        self.reason = reason
