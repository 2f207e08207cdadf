"""Run one scheduled step: build the flattened batch and its `AttentionMetadata`, run the model
over it, sample one token for every chunk that reaches its sequence's end."""

from __future__ import annotations

import torch

from builtin_engine.attention_metadata import AttentionMetadata
from builtin_engine.llama import KVCache, LlamaModel
from builtin_engine.sampler import Sampler, SamplerOutput, prepare_sampling_metadata
from builtin_engine.scheduler import ScheduledChunk
from builtin_engine.sequence import Sequence


class ModelRunner:
    def __init__(self, model: LlamaModel, *, kv_cache: KVCache, block_size: int, sampler: Sampler) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.sampler = sampler
        self.device = model.device

    @torch.inference_mode()
    def execute(self, chunks: list[ScheduledChunk]) -> tuple[list[Sequence], SamplerOutput | None]:
        """The sequences that sampled this step (in order) and their tokens."""
        input_ids, meta, sampling_seqs = self.prepare_inputs(chunks)
        hidden = self.model.forward(input_ids, meta, self.kv_cache)  # [S, H]
        if not sampling_seqs:
            return [], None
        logits = self.model.compute_logits(hidden)  # [S, V] float32
        sampling = prepare_sampling_metadata(sampling_seqs, device=self.device)
        return sampling_seqs, self.sampler(logits, sampling)

    def prepare_inputs(self, chunks: list[ScheduledChunk]) -> tuple[torch.Tensor, AttentionMetadata, list[Sequence]]:
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
        num_decode = 0
        for chunk in chunks:
            seq, table, start, end = chunk.seq, chunk.seq.block_table, chunk.start, chunk.end
            if chunk.is_decode:
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
                cu_seqlens_q.append(cu_seqlens_q[-1] + chunk.num_tokens)
            if chunk.samples:
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
        return torch.tensor(input_ids, dtype=torch.int64, device=dev), meta, sampling_seqs

    def _block_tables(self, tables: list[list[int]]) -> torch.Tensor:
        """[B, max_blocks] int32; rows padded with block 0, which attention never reads past seq_len."""
        width = max((len(t) for t in tables), default=0)
        padded = [t + [0] * (width - len(t)) for t in tables]
        return torch.tensor(padded, dtype=torch.int32, device=self.device).reshape(len(tables), width)
