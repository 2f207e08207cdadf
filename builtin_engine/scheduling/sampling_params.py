"""Per-request sampling parameters as the engine sees them.

Field names and defaults mirror `plugins.contract.protocol.Sampling`, so the backend plugin converts
one into the other field by field; the engine does not import `plugins`. `None` means "not set",
never a magic number. `grammar` is the engine's own addition (structured outputs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from builtin_engine.errors import InvalidRequestError

if TYPE_CHECKING:
    from builtin_engine.text.structured import Grammar


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int | None = None  # None (or 0, or vLLM's -1): off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] | None = None
    seed: int | None = None
    max_tokens: int | None = None  # None: the rest of the context
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    logprobs: bool = False
    top_logprobs: int = 0
    # Engine-only (not a protocol field): the compiled grammar the output must follow
    # (`builtin_engine.text.structured`); each sequence decodes under its own matcher of it.
    grammar: Grammar | None = None

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        )

    def validate(self, *, vocab_size: int, max_top_logprobs: int) -> None:
        """Raise `InvalidRequestError` naming the first field out of range."""
        checks: list[tuple[bool, str, str]] = [
            (self.n >= 1, "n", "must be at least 1"),
            (self.temperature >= 0.0, "temperature", "must be non-negative"),
            (0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]"),
            (self.top_k is None or self.top_k >= -1, "top_k", "must be positive, or null / 0 / -1 for off"),
            (0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]"),
            (self.repetition_penalty > 0.0, "repetition_penalty", "must be positive"),
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "must be at least 1"),
            (self.min_tokens >= 0, "min_tokens", "must be non-negative"),
            (
                self.max_tokens is None or self.min_tokens <= self.max_tokens,
                "min_tokens",
                "must not exceed max_tokens",
            ),
            (
                0 <= self.top_logprobs <= max_top_logprobs,
                "top_logprobs",
                f"must be in [0, {max_top_logprobs}]",
            ),
            (all(s for s in self.stop), "stop", "must not contain empty strings"),
        ]
        for ok, param, what in checks:
            if not ok:
                raise InvalidRequestError(f"`{param}` {what}.", param=param)
        for token_id in (*self.stop_token_ids, *(self.logit_bias or {})):
            if not 0 <= int(token_id) < vocab_size:
                raise InvalidRequestError(
                    f"token id {token_id} is outside the vocabulary (size {vocab_size}).",
                    param="logit_bias" if token_id not in self.stop_token_ids else "stop_token_ids",
                )
