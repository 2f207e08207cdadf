"""Run one scheduled step: build the flattened batch and its `AttentionMetadata`, run the model
over it layer by layer, sample one token for every chunk that reaches its sequence's end.

A pooling sequence (embeddings) samples nothing: the final-normed hidden states of the rows its
pool reads go to its `PoolingState` (see `builtin_engine.pooling`).

Between layers the runner asks `poll_aborted` (the engine's) which requests were aborted since
the step began; their rows leave the batch at once, so an abort takes effect within one layer's
time instead of one step's (a step is up to ~1 s during a long prefill chunk on a CPU).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from builtin_engine.model.attention_metadata import AttentionMetadata
from builtin_engine.model.llama import KVCache, LlamaModel
from builtin_engine.runner.decode_graph import CudaGraphDecode
from builtin_engine.runner.sampler import Sampler, SamplerOutput, prepare_sampling_metadata
from builtin_engine.runner.step_graph import CompiledStep
from builtin_engine.scheduling.scheduler import ScheduledChunk
from builtin_engine.scheduling.sequence import Sequence

PollAborted = Callable[[], Collection[str]]  # -> ids of requests aborted (and freed) since the last call


@dataclass(frozen=True, slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [T] int64
    meta: AttentionMetadata
    sampling_seqs: list[Sequence]  # row i of the logits samples for sampling_seqs[i]
    pooling: list[tuple[Sequence, int, list[int]]]  # (pooling seq, its chunk's start, the rows its pool reads)


class ModelRunner:
    def __init__(self, model: LlamaModel, *, kv_cache: KVCache, block_size: int, sampler: Sampler,
                 decode_graph: CudaGraphDecode | None = None, step_graph: CompiledStep | None = None) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.sampler = sampler
        self.device = model.device
        self.decode_graph = decode_graph  # runs all-decode steps when set (see builtin_engine.runner.decode_graph)
        self.step_graph = step_graph  # runs the other steps (all, without a decode graph) when set
        self.num_graph_steps = 0  # steps a graph ran

    @torch.inference_mode()
    def execute(self, chunks: list[ScheduledChunk], *,
                poll_aborted: PollAborted | None = None) -> tuple[list[Sequence], SamplerOutput | None]:
        """The sequences that sampled this step (in order) and their tokens. Chunks of requests
        that `poll_aborted` names are dropped mid-step: they neither sample nor count as computed.
        An all-decode step goes to the decode graph, when there is one, any other to the step graph,
        when there is one; aborts then apply before the step."""
        all_decode = bool(chunks) and all(c.is_decode for c in chunks)
        graph = self.decode_graph if all_decode and self.decode_graph is not None else self.step_graph
        if graph is not None and chunks:
            aborted = poll_aborted() if poll_aborted is not None else ()
            kept = [c for c in chunks if c.seq.request_id not in aborted] if aborted else chunks
            if not kept:
                return [], None
            logits = graph.run(kept)  # decode graph: [len(kept), V]; step graph: [sampling chunks, V]
            if logits is not None:
                self.num_graph_steps += 1
                rows = [i for i, c in enumerate(kept) if c.samples]
                seqs = [kept[i].seq for i in rows]
                if graph is self.decode_graph and len(rows) < len(kept):
                    logits = logits[rows]
                if not seqs:
                    return [], None
                return seqs, self.sampler(logits, prepare_sampling_metadata(seqs, device=self.device))
            chunks = kept
        inputs = self.prepare_inputs(chunks)
        hidden, residual = self.model.embed(inputs.input_ids), None  # [T, H]
        for index in range(self.model.num_layers):
            aborted = poll_aborted() if poll_aborted is not None else ()
            if aborted:
                kept = [c for c in chunks if c.seq.request_id not in aborted]
                if not kept:
                    return [], None
                rows = _rows_of(chunks, kept, device=self.device)
                hidden = hidden.index_select(0, rows)
                residual = None if residual is None else residual.index_select(0, rows)
                chunks, inputs = kept, self.prepare_inputs(kept)
            hidden, residual = self.model.layer(index, hidden, residual, inputs.meta, self.kv_cache)
        if inputs.pooling:
            self._pool(hidden, residual, inputs.pooling)
        if not inputs.sampling_seqs:
            return [], None
        hidden = self.model.final_norm(hidden, residual, inputs.meta.logits_indices)  # [S, H]
        logits = self.model.compute_logits(hidden)  # [S, V] float32
        sampling = prepare_sampling_metadata(inputs.sampling_seqs, device=self.device)
        return inputs.sampling_seqs, self.sampler(logits, sampling)

    def _pool(self, hidden: torch.Tensor, residual: torch.Tensor | None,
              pooling: list[tuple[Sequence, int, list[int]]]) -> None:
        rows = [row for _, _, seq_rows in pooling for row in seq_rows]
        normed = self.model.final_norm(hidden, residual, torch.tensor(rows, dtype=torch.int64, device=self.device))
        offset = 0
        for seq, start, seq_rows in pooling:
            assert seq.pooling is not None
            seq.pooling.add(start, normed[offset : offset + len(seq_rows)])
            offset += len(seq_rows)

    def prepare_inputs(self, chunks: list[ScheduledChunk]) -> StepInputs:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefill_tables: list[list[int]] = []
        prefill_lens: list[int] = []
        cu_seqlens_q = [0]
        logits_indices: list[int] = []
        sampling_seqs: list[Sequence] = []
        pooling: list[tuple[Sequence, int, list[int]]] = []
        num_decode = 0
        for chunk in chunks:
            seq, start, end = chunk.seq, chunk.start, chunk.start + chunk.num_tokens
            table = seq.block_table
            if end - start == 1:  # a decode row
                assert not prefill_tables, "decode chunks must come first"
                input_ids.append(seq.token_ids[start])
                positions.append(start)
                slots.append(table[start // bs] * bs + start % bs)
                decode_tables.append(table)
                decode_lens.append(end)
                num_decode += 1
            else:
                input_ids.extend(seq.token_ids[start:end])
                positions.extend(range(start, end))
                slots.extend([table[p // bs] * bs + p % bs for p in range(start, end)])
                prefill_tables.append(table)
                prefill_lens.append(end)
                cu_seqlens_q.append(cu_seqlens_q[-1] + end - start)
            if seq.pooling is not None:
                first_row = len(input_ids) - (end - start)
                wanted = seq.pooling.rows_wanted(start, end, seq.num_prompt_tokens)
                pooling.append((seq, start, [first_row + p - start for p in wanted]))
            elif end == len(seq.token_ids):  # the chunk reaches the sequence's end: it samples
                logits_indices.append(len(input_ids) - 1)
                sampling_seqs.append(seq)
        dev = self.device
        meta = AttentionMetadata(
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            num_decode_tokens=num_decode,
            decode_block_tables=self._block_tables(decode_tables),
            decode_seq_lens=torch.tensor(decode_lens, dtype=torch.int32, device=dev),
            prefill_block_tables=self._block_tables(prefill_tables),
            prefill_cu_seqlens_q=torch.tensor(cu_seqlens_q, dtype=torch.int32, device=dev),
            prefill_seq_lens=torch.tensor(prefill_lens, dtype=torch.int32, device=dev),
            logits_indices=torch.tensor(logits_indices, dtype=torch.int64, device=dev),
        )
        return StepInputs(torch.tensor(input_ids, dtype=torch.int64, device=dev), meta, sampling_seqs, pooling)

    def _block_tables(self, tables: list[list[int]]) -> torch.Tensor:
        """[B, max_blocks] int32; rows padded with block 0, which attention never reads past seq_len."""
        width = max((len(t) for t in tables), default=0)
        padded = [t + [0] * (width - len(t)) if len(t) < width else t for t in tables]
        return torch.tensor(padded, dtype=torch.int32, device=self.device).reshape(len(tables), width)


def _rows_of(chunks: list[ScheduledChunk], kept: list[ScheduledChunk], *, device: torch.device) -> torch.Tensor:
    """[T'] int64: the rows of the flattened batch of `chunks` that belong to `kept` (a
    subsequence of `chunks`), in order."""
    wanted = {id(c) for c in kept}
    rows: list[int] = []
    start = 0
    for chunk in chunks:
        if id(chunk) in wanted:
            rows.extend(range(start, start + chunk.num_tokens))
        start += chunk.num_tokens
    return torch.tensor(rows, dtype=torch.int64, device=device)
