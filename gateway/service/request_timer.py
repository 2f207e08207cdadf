"""Wall-clock marks of one request: time to first token, end to end, and the gaps between tokens."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from plugins.contract.protocol import Event, TextDelta, Usage


@dataclass
class RequestTimer:
    """Wall-clock marks of one request, for metrics and the `on_response` hook."""

    start: float = field(default_factory=time.perf_counter)
    wall_start: float = field(default_factory=time.time)
    first_token: float | None = None
    last_token: float | None = None
    itl: list[float] = field(default_factory=list)

    def mark_tokens(self) -> None:
        now = time.perf_counter()
        if self.first_token is None:
            self.first_token = now
        elif self.last_token is not None:
            self.itl.append(now - self.last_token)
        self.last_token = now

    def as_dict(self) -> dict[str, Any]:
        end = time.perf_counter()
        ttft = None if self.first_token is None else self.first_token - self.start
        return {"ttft": ttft, "e2e": end - self.start, "itl": self.itl}


def is_token_event(event: Event) -> bool:
    return not isinstance(event, Usage) and (not isinstance(event, TextDelta) or bool(event.text or event.logprobs))
