"""What one client key may use, and what one request will cost it.

A request reserves its cost up front — the prompt's estimated size plus every token it may
generate (`max_tokens` for each of its `n` choices) — and settles on the real usage when it
ends, so a request can overshoot a token limit by no more than its own estimate's error.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Literal

from gateway.config import KeyConfig
from plugins.contract.protocol import RequestSpec

CHARS_PER_TOKEN = 4  # the usual English estimate; the settlement corrects it
TOKENS_PER_MESSAGE = 4  # role and separators a chat template adds per message


@dataclass(frozen=True)
class KeyLimits:
    """One `[[server.keys]]` table's limits; None: not limited in that way."""

    name: str  # the key's name: its counts are kept under it
    rpm: int | None = None
    tpm: int | None = None
    max_parallel: int | None = None
    budget_tokens: int | None = None
    budget_period: Literal["day", "month"] = "day"

    @classmethod
    def from_config(cls, entry: KeyConfig) -> KeyLimits | None:
        if not entry.has_limits:
            return None
        assert entry.name is not None  # config validation: a key with limits has a name
        return cls(
            name=entry.name,
            rpm=entry.rpm,
            tpm=entry.tpm,
            max_parallel=entry.max_parallel,
            budget_tokens=entry.budget_tokens,
            budget_period=entry.budget_period or "day",
        )

    @property
    def counts_tokens(self) -> bool:
        return self.tpm is not None or self.budget_tokens is not None


@dataclass(frozen=True)
class TokenCost:
    """What a request reserves: its prompt's estimated tokens and the most it may generate."""

    prompt: int
    completion: int

    @property
    def total(self) -> int:
        return self.prompt + self.completion


NO_COST = TokenCost(0, 0)


@dataclass(frozen=True)
class BudgetPeriod:
    """The calendar period (UTC) a budget counts in: its id and when it ends (epoch seconds)."""

    id: str  # "2025-06-14" or "2025-06"
    ends_at: float

    @classmethod
    def at(cls, kind: Literal["day", "month"], now: float) -> BudgetPeriod:
        today = datetime.fromtimestamp(now, UTC).date()
        if kind == "day":
            return cls(id=today.isoformat(), ends_at=_epoch(today + timedelta(days=1)))
        first_next = date(today.year + today.month // 12, today.month % 12 + 1, 1)
        return cls(id=f"{today.year:04d}-{today.month:02d}", ends_at=_epoch(first_next))


def _epoch(day: date) -> float:
    return datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()


def estimate_prompt_tokens(spec: RequestSpec) -> int:
    """A prompt's size in tokens, estimated from its characters (no tokenizer on this path)."""
    if isinstance(spec.prompt, list):
        return len(spec.prompt)
    if spec.messages is None:
        return len(spec.prompt or "") // CHARS_PER_TOKEN + 1
    chars = 0
    for message in spec.messages:
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(part.get("text") or "") for part in content if isinstance(part, dict))
    return chars // CHARS_PER_TOKEN + TOKENS_PER_MESSAGE * len(spec.messages) + 1


def request_cost(spec: RequestSpec, max_model_len: int | None) -> TokenCost:
    """The reservation for `spec`: the estimated prompt plus `max_tokens` per choice — or, when
    the request sets no `max_tokens`, the rest of the model's context (nothing when unknown)."""
    prompt = estimate_prompt_tokens(spec)
    per_choice = spec.sampling.max_tokens
    if per_choice is None:
        per_choice = max(0, max_model_len - prompt) if max_model_len else 0
    return TokenCost(prompt=prompt, completion=per_choice * spec.sampling.n)
