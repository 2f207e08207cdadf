"""Pooled hidden states: the engine's embeddings.

A pooling request is one prompt scheduled like any other (prefilled in chunks, batched with
decoding sequences) whose sequence samples nothing: the model runner hands each of its chunks'
final-normed hidden states to the sequence's `PoolingState`, and once the prompt's last token has
been computed the engine finishes it with the pooled vector.

- `last` (the default, as vLLM pools decoder models): the last token's hidden state. The prefix
  cache may serve the rest of the prompt, which is never computed again.
- `mean`: the mean over every prompt token; `cls`: the first token's. Both need the hidden state
  of tokens the prefix cache would skip, so these sequences do not reuse cached blocks.

Then matryoshka truncation to `dimensions` (the first components), then L2 normalization
(`normalize`), in that order as in vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

PoolingMethod = Literal["last", "mean", "cls"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolingParams:
    method: PoolingMethod = "last"
    normalize: bool = True
    dimensions: int | None = None  # keep the first `dimensions` components; None: all

    @property
    def needs_every_token(self) -> bool:
        """Whether every prompt token's hidden state is read (so no cached prefix may be skipped)."""
        return self.method != "last"


class PoolingState:
    """One sequence's running pool, fed chunk by chunk in prompt order."""

    __slots__ = ("params", "_sum", "_count", "_last")

    def __init__(self, params: PoolingParams) -> None:
        self.params = params
        self._sum: torch.Tensor | None = None  # [H] float32: sum (mean), first row (cls)
        self._count = 0
        self._last: torch.Tensor | None = None

    def rows_wanted(self, start: int, end: int, num_prompt_tokens: int) -> range:
        """The positions of chunk [start, end) whose hidden states this pool reads."""
        method = self.params.method
        if method == "mean":
            return range(start, end)
        if method == "cls":
            return range(start, start + 1) if start == 0 else range(0)
        return range(end - 1, end) if end == num_prompt_tokens else range(0)

    def add(self, start: int, hidden: torch.Tensor) -> None:
        """`hidden` [R, H]: the final-normed states of the rows `rows_wanted` named for a chunk
        beginning at `start` (a chunk from position 0 starts the pool over: a recompute)."""
        if start == 0:
            self._sum, self._count, self._last = None, 0, None
        if hidden.shape[0] == 0:
            return
        rows = hidden.float()
        if self.params.method == "mean":
            total = rows.sum(dim=0)
            self._sum = total if self._sum is None else self._sum + total
            self._count += rows.shape[0]
        elif self.params.method == "cls":
            self._sum = rows[0]
        else:
            self._last = rows[-1]

    def result(self) -> list[float]:
        if self.params.method == "mean":
            assert self._sum is not None and self._count
            vector = self._sum / self._count
        elif self.params.method == "cls":
            assert self._sum is not None
            vector = self._sum
        else:
            assert self._last is not None
            vector = self._last
        if self.params.dimensions is not None:
            vector = vector[: self.params.dimensions]
        if self.params.normalize:
            vector = torch.nn.functional.normalize(vector, dim=0)
        return vector.tolist()
