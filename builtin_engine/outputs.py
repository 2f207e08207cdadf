"""What the engine hands back per step: the new tokens and text of each choice of a request.

Plain dataclasses with no torch behind them, so a client in another process decodes them as
they are (`builtin_engine.process.calls`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, logprob), most likely first


@dataclass(slots=True)
class ChoiceOutput:
    """One choice's news from one step. `text` is empty while it is held back (a possible stop
    string, or a partial UTF-8 character inside the detokenizer)."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None = None  # set when the request asked for logprobs
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    choices: list[ChoiceOutput] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache
    num_output_tokens: int = 0  # so far, summed over choices
    finished: bool = False  # every choice has finished; the last output of the request
    embedding: list[float] | None = None  # a pooling request's vector (its only output)
