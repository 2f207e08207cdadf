"""Continuous batching: which sequences compute how many tokens in the next step.

Each step has a token budget (`max_num_batched_tokens`). Running sequences come first, in
priority order (lower `priority`, then earlier arrival): a decoding sequence takes one token, a
sequence still prefilling takes the next chunk of its prompt. When the KV cache has no block for
a running sequence, the least important running sequence is preempted (its blocks freed, to be
recomputed later; the prefix cache often gives them back). Waiting sequences, in priority order,
fill what budget and `max_num_seqs` slots are left, starting from their longest cached prefix.
No waiting sequence is admitted in a step that had to preempt.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from builtin_engine.scheduling.block_manager import BlockManager
from builtin_engine.scheduling.sequence import Sequence, SequenceStatus


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    """`seq` computes tokens [start, start + num_tokens) this step."""

    seq: Sequence
    start: int
    num_tokens: int

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def is_decode(self) -> bool:
        """One query token: served by the decode attention path."""
        return self.num_tokens == 1

    @property
    def samples(self) -> bool:
        """Whether this chunk reaches the sequence's last token, so a new token is sampled."""
        return self.end == self.seq.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)  # one-token chunks first
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.chunks

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)


class Scheduler:
    def __init__(self, *, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be positive")
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: list[Sequence] = []  # sorted by priority_key
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=Sequence.priority_key)

    def has_work(self) -> bool:
        return bool(self.running) or any(s.can_start() for s in self.waiting)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self.running.sort(key=Sequence.priority_key)
        budget = self._schedule_running(out, self.max_num_batched_tokens)
        if not out.preempted:
            self._schedule_waiting(out, budget)
        out.chunks.sort(key=lambda c: not c.is_decode)  # stable: decode rows first
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.block_manager.allocate_slots(seq, seq.num_computed_tokens + num_new):
                victim = self.running.pop()  # least important: last in priority order
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                out.chunks.append(ScheduledChunk(seq, seq.num_computed_tokens, num_new))
                budget -= num_new
                i += 1
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        for seq in list(self.waiting):
            if budget == 0 or len(self.running) >= self.max_num_seqs:
                return
            if not seq.can_start():
                continue
            reads_every_token = seq.pooling is not None and seq.pooling.params.needs_every_token
            cached = [] if reads_every_token else self.block_manager.find_cached_prefix(seq)
            num_computed = len(cached) * self.block_manager.block_size
            num_new = min(seq.num_tokens - num_computed, budget)
            if not self.block_manager.allocate_slots(seq, num_computed + num_new, cached):
                return
            seq.num_computed_tokens = num_computed
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = num_computed
            self.waiting.remove(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.chunks.append(ScheduledChunk(seq, num_computed, num_new))
            budget -= num_new

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.reset_for_recompute()
        self.num_preemptions += 1
        self.add(seq)

    def update_after_step(self, out: SchedulerOutput) -> None:
        """Record the KV computed by the step and register newly full blocks for reuse. Call
        before appending the sampled tokens. Sequences finished during the step (aborted between
        two layers) are skipped: their blocks are gone."""
        for chunk in out.chunks:
            if chunk.seq.is_finished:
                continue
            chunk.seq.num_computed_tokens = chunk.end
            self.block_manager.register_full_blocks(chunk.seq)

    def finish(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out of the queues and free its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
