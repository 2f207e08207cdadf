"""One sequence: the token ids of one choice of one request, and where it stands in the engine.

A request with `n` choices has `n` sequences over the same prompt. Choice 0 (the leader) prefills
first; the others `wait_for` it, so that they find the prompt's full blocks in the prefix cache
and share them instead of computing them again.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from builtin_engine.scheduling.sampling_params import SamplingParams

if TYPE_CHECKING:
    from builtin_engine.pooling import PoolingParams, PoolingState
    from builtin_engine.text.structured import Matcher


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED = enum.auto()


class Sequence:
    __slots__ = (
        "seq_id",
        "request_id",
        "index",
        "params",
        "priority",
        "arrival",
        "seed",
        "max_tokens",
        "waits_for",
        "token_ids",
        "num_prompt_tokens",
        "num_computed_tokens",
        "num_cached_tokens",
        "block_table",
        "block_hashes",
        "num_registered_blocks",
        "status",
        "matcher",
        "pooling",
    )

    def __init__(
        self,
        *,
        seq_id: int,
        request_id: str,
        index: int,
        prompt_ids: list[int],
        params: SamplingParams,
        priority: int,
        arrival: int,
        seed: int,
        max_tokens: int,
        waits_for: Sequence | None = None,
        pooling: PoolingParams | None = None,
    ) -> None:
        self.seq_id = seq_id
        self.request_id = request_id
        self.index = index  # choice index within the request
        self.params = params
        self.priority = priority  # lower runs first
        self.arrival = arrival  # request arrival order; ties broken by `index`
        self.seed = seed  # per-choice sampling seed
        self.max_tokens = max_tokens  # resolved: never None
        self.waits_for = waits_for  # the leader whose prefill must finish first
        self.token_ids: list[int] = list(prompt_ids)
        self.num_prompt_tokens = len(prompt_ids)
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.num_cached_tokens: int | None = None  # prompt tokens served by the prefix cache, set once
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # hash chain of full blocks, grown lazily
        self.num_registered_blocks = 0  # leading blocks of block_table already in the prefix cache
        self.status = SequenceStatus.WAITING
        # structured outputs: this sequence's grammar state (advanced by the output processor)
        self.matcher: Matcher | None = params.grammar.new_matcher() if params.grammar is not None else None
        # a pooling request's sequence (embeddings): it samples nothing, its prompt's hidden
        # states are pooled (see `builtin_engine.pooling`)
        self.pooling: PoolingState | None = None
        if pooling is not None:
            from builtin_engine.pooling import PoolingState

            self.pooling = PoolingState(pooling)

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id}#{self.index}, {self.status.name}, prio={self.priority}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens})"
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def is_prefill_done(self) -> bool:
        return self.num_computed_tokens >= self.num_prompt_tokens

    def priority_key(self) -> tuple[int, int, int]:
        """Sort key: lower priority value first, then earlier arrival, then choice index."""
        return (self.priority, self.arrival, self.index)

    def can_start(self) -> bool:
        """Whether a waiting sequence may be scheduled: a follower waits for its leader's prefill."""
        leader = self.waits_for
        return leader is None or leader.is_finished or leader.is_prefill_done

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def reset_for_recompute(self) -> None:
        """Forget the KV cache (after preemption); tokens, seed and output so far are kept."""
        self.num_computed_tokens = 0
        self.block_table = []
        self.num_registered_blocks = 0
        self.status = SequenceStatus.WAITING
