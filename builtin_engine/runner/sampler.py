"""Turn a step's logits into one new token per sampling sequence.

Order, as in vLLM: the structured-output masks (tokens a sequence's grammar forbids next set to
-inf; only rows that have a grammar, see `builtin_engine.text.structured`), logits processors
(logit_bias, min_tokens ban on EOS / stop token ids, repetition / presence / frequency
penalties), then `kernels.sample` does temperature, top-k, top-p, min-p and the pick,
reproducibly per row from the row's seed and its number of generated
tokens (so a seeded request gives the same tokens whoever it is batched with, and a recompute
after preemption does not change them).

Logprobs: by default ("raw", vLLM's default `logprobs_mode`) the log-softmax of the model's
logits before any processing, so a token's logprob does not depend on the sampling knobs.
"processed" takes them after the processors and temperature (before top-k/top-p/min-p
truncation), like vLLM's `processed_logprobs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

import kernels
from builtin_engine.outputs import TokenLogprobs
from builtin_engine.scheduling.sequence import Sequence
from builtin_engine.text.structured import MaskBuffer

LogprobsMode = Literal["raw", "processed"]
_SEED_MASK = (1 << 63) - 1
_U64 = (1 << 64) - 1


def choice_seed(seed: int, index: int) -> int:
    """The sampling seed of choice `index` of a request seeded with `seed`; choice 0 keeps it, so
    n=1 and choice 0 of n>1 agree. Others are splitmix64 mixes, far apart for nearby seeds."""
    if index == 0:
        return seed & _SEED_MASK
    z = (seed + index * 0x9E3779B97F4A7C15) & _U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
    return (z ^ (z >> 31)) & _SEED_MASK


@dataclass(frozen=True, slots=True)
class SamplingMetadata:
    """Row i of the logits samples for `seqs[i]`."""

    seqs: tuple[Sequence, ...]
    temperature: torch.Tensor  # [S] float32, 0 = greedy
    top_k: torch.Tensor  # [S] int32, 0 = off
    top_p: torch.Tensor  # [S] float32
    min_p: torch.Tensor  # [S] float32
    seeds: torch.Tensor  # [S] int64
    offsets: torch.Tensor  # [S] int64, tokens generated so far
    processed_rows: tuple[int, ...]  # rows with a logits processor to apply
    logprob_rows: tuple[int, ...]  # rows that asked for logprobs
    grammar_rows: tuple[int, ...] = ()  # rows whose sequence decodes under a grammar


def prepare_sampling_metadata(seqs: list[Sequence], *, device: torch.device) -> SamplingMetadata:
    params = [s.params for s in seqs]
    processed, logprob_rows, grammar_rows = [], [], []
    for row, (seq, p) in enumerate(zip(seqs, params)):
        if p.has_penalties or p.logit_bias or seq.num_output_tokens < p.min_tokens:
            processed.append(row)
        if p.logprobs:
            logprob_rows.append(row)
        if seq.matcher is not None:
            grammar_rows.append(row)
    return SamplingMetadata(
        seqs=tuple(seqs),
        temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
        top_k=torch.tensor([max(p.top_k or 0, 0) for p in params], dtype=torch.int32, device=device),
        top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
        min_p=torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device),
        seeds=torch.tensor([s.seed for s in seqs], dtype=torch.int64, device=device),
        offsets=torch.tensor([s.num_output_tokens for s in seqs], dtype=torch.int64, device=device),
        processed_rows=tuple(processed),
        logprob_rows=tuple(logprob_rows),
        grammar_rows=tuple(grammar_rows),
    )


@dataclass(frozen=True, slots=True)
class SamplerOutput:
    token_ids: list[int]  # one per row
    logprobs: list[TokenLogprobs | None]  # one per row; None where not asked


class Sampler:
    def __init__(self, *, eos_token_ids: frozenset[int], logprobs_mode: LogprobsMode = "raw") -> None:
        self.eos_token_ids = eos_token_ids
        self.logprobs_mode = logprobs_mode
        self._masks = MaskBuffer()

    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        """logits [S, V] float32 (modified in place) -> one token per row."""
        logprobs: torch.Tensor | None = None
        if meta.logprob_rows and self.logprobs_mode == "raw":
            logprobs = torch.log_softmax(logits[list(meta.logprob_rows)], dim=-1)
        if meta.grammar_rows:
            rows = meta.grammar_rows
            self._masks.fill_and_apply(logits, rows, [meta.seqs[r].matcher for r in rows])  # type: ignore[misc]
        for row in meta.processed_rows:
            self._process_row(logits[row], meta.seqs[row])
        if meta.logprob_rows and self.logprobs_mode == "processed":
            rows = list(meta.logprob_rows)
            temperature = meta.temperature[rows].clamp_min(1e-5)
            scaled = logits[rows] / torch.where(meta.temperature[rows] > 0, temperature, 1.0)[:, None]
            logprobs = torch.log_softmax(scaled, dim=-1)
        token_ids = kernels.sample(
            logits, meta.temperature, meta.top_k, meta.top_p, meta.min_p, meta.seeds, meta.offsets
        ).tolist()
        return SamplerOutput(token_ids=token_ids, logprobs=self._gather_logprobs(logprobs, token_ids, meta))

    def _process_row(self, logits: torch.Tensor, seq: Sequence) -> None:
        """Apply logit_bias, the min_tokens ban and the penalties to one row [V] in place."""
        p = seq.params
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias.keys()), dtype=torch.int64, device=logits.device)
            logits.index_add_(0, ids, torch.tensor(list(p.logit_bias.values()), dtype=logits.dtype,
                                                   device=logits.device))
        if seq.num_output_tokens < p.min_tokens:
            banned = set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.eos_token_ids))
            if banned:
                ids = torch.tensor(sorted(banned), device=logits.device)
                kept = logits[ids].clone() if seq.matcher is not None else None
                logits[ids] = float("-inf")
                if kept is not None and not torch.isfinite(logits).any():
                    logits[ids] = kept  # the grammar allows nothing but to end: it wins over min_tokens
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(seq.token_ids, dtype=torch.int64, device=logits.device).unique()
            values = logits[seen]
            logits[seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
        if (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0) and seq.num_output_tokens:
            output = torch.tensor(seq.output_token_ids, dtype=torch.int64, device=logits.device)
            counts = torch.bincount(output, minlength=logits.shape[0]).to(logits.dtype)
            logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)

    @staticmethod
    def _gather_logprobs(logprobs: torch.Tensor | None, token_ids: list[int],
                         meta: SamplingMetadata) -> list[TokenLogprobs | None]:
        result: list[TokenLogprobs | None] = [None] * len(token_ids)
        if logprobs is None:
            return result
        rows = meta.logprob_rows
        chosen = logprobs[torch.arange(len(rows)), torch.tensor([token_ids[r] for r in rows])].tolist()
        num_top = max(meta.seqs[r].params.top_logprobs for r in rows)
        top_values, top_ids = (logprobs.topk(num_top, dim=-1) if num_top else (None, None))
        for i, row in enumerate(rows):
            k = meta.seqs[row].params.top_logprobs
            top: tuple[tuple[int, float], ...] = ()
            if k:
                assert top_ids is not None and top_values is not None
                top = tuple(zip(top_ids[i, :k].tolist(), top_values[i, :k].tolist()))
            result[row] = TokenLogprobs(token_id=token_ids[row], logprob=chosen[i], top=top)
        return result
