"""The typed per-step batch description the model reads. Built by `model_runner.prepare_inputs`,
passed explicitly to `LlamaModel.forward` (no global context).

The step's tokens are flattened into one batch of T rows: first `num_decode_tokens` rows of
one-token chunks (decodes), then the prefill chunks back to back. All tensors live on the
model's device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    positions: torch.Tensor  # [T] int64, position of each token in its sequence
    slot_mapping: torch.Tensor  # [T] int64, KV cache slot (block * block_size + offset) of each token
    num_decode_tokens: int  # rows [0, num_decode_tokens) are one-token chunks
    decode_block_tables: torch.Tensor  # [Bd, max_blocks] int32
    decode_seq_lens: torch.Tensor  # [Bd] int32, context length incl. the new token
    prefill_block_tables: torch.Tensor  # [Bp, max_blocks] int32
    prefill_cu_seqlens_q: torch.Tensor  # [Bp + 1] int32, chunk boundaries within the prefill rows
    prefill_seq_lens: torch.Tensor  # [Bp] int32, context length incl. the chunk
    logits_indices: torch.Tensor  # [S] int64, rows whose hidden state is turned into logits

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode_tokens
