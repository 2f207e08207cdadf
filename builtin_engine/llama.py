"""The Llama-family forward pass over a flattened batch of tokens (decode rows and prefill chunks
together), reading and writing the paged KV cache. Every non-matmul op goes through `kernels`,
which picks Triton on CUDA and the torch reference elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import kernels
from builtin_engine.attention_metadata import AttentionMetadata
from builtin_engine.loader import LayerWeights, LlamaWeights, ModelConfig


@dataclass(slots=True)
class KVCache:
    """Per layer, `[num_blocks, block_size, Hkv, D]` key and value tensors."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @classmethod
    def allocate(cls, config: ModelConfig, *, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> KVCache:
        shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
        return cls(
            keys=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)],
            values=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)],
        )


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: LlamaWeights, *, max_positions: int) -> None:
        self.config = config
        self.weights = weights
        self.device = weights.embed_tokens.device
        self.dtype = weights.embed_tokens.dtype
        self.scale = config.head_dim**-0.5
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        inv_freq = config.rope_inv_freq()
        self.cos_sin_cache = kernels.make_cos_sin_cache(
            max_positions, config.head_dim, config.rope_theta, device=self.device,
            inv_freq=None if inv_freq is None else inv_freq.to(self.device),
        )  # [max_positions, D] float32

    def forward(self, input_ids: torch.Tensor, meta: AttentionMetadata, kv_cache: KVCache) -> torch.Tensor:
        """input_ids [T] int64 -> final-normed hidden states of the `meta.logits_indices` rows [S, H]."""
        w = self.weights
        hidden = F.embedding(input_ids, w.embed_tokens)  # [T, H]
        residual: torch.Tensor | None = None
        for i, layer in enumerate(w.layers):
            hidden, residual = self._layer(layer, hidden, residual, meta, kv_cache.keys[i], kv_cache.values[i])
        hidden = hidden[meta.logits_indices]
        residual = residual[meta.logits_indices]  # type: ignore[index]
        hidden, _ = kernels.fused_add_rms_norm(hidden, residual, w.norm, self.config.rms_norm_eps)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[S, H] -> [S, V] float32."""
        return F.linear(hidden, self.weights.lm_head).float()

    def _layer(
        self,
        layer: LayerWeights,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        eps = self.config.rms_norm_eps
        if residual is None:
            residual = hidden
            hidden = kernels.rms_norm(hidden, layer.input_norm, eps)
        else:
            hidden, residual = kernels.fused_add_rms_norm(hidden, residual, layer.input_norm, eps)
        hidden = self._attention(layer, hidden, meta, k_cache, v_cache)
        hidden, residual = kernels.fused_add_rms_norm(hidden, residual, layer.post_attention_norm, eps)
        gate_up = F.linear(hidden, layer.gate_up_proj)  # [T, 2I]
        hidden = F.linear(kernels.silu_and_mul(gate_up), layer.down_proj)  # [T, H]
        return hidden, residual

    def _attention(
        self,
        layer: LayerWeights,
        hidden: torch.Tensor,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        c = self.config
        num_tokens = hidden.shape[0]
        qkv = F.linear(hidden, layer.qkv_proj, layer.qkv_bias)  # [T, (Hq + 2 Hkv) D]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(num_tokens, c.num_heads, c.head_dim)  # views into qkv, not contiguous
        k = k.reshape(num_tokens, c.num_kv_heads, c.head_dim)
        v = v.reshape(num_tokens, c.num_kv_heads, c.head_dim)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # rotary works in place
        kernels.rotary(q, k, meta.positions, self.cos_sin_cache)
        kernels.reshape_and_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        num_decode = meta.num_decode_tokens
        if num_decode == num_tokens:
            out = kernels.paged_attention_decode(
                q, k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, self.scale
            )
        elif num_decode == 0:
            out = kernels.paged_attention_prefill(
                q, k_cache, v_cache, meta.prefill_block_tables, meta.prefill_cu_seqlens_q,
                meta.prefill_seq_lens, self.scale,
            )
        else:
            out = torch.empty_like(q)
            out[:num_decode] = kernels.paged_attention_decode(
                q[:num_decode], k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, self.scale
            )
            out[num_decode:] = kernels.paged_attention_prefill(
                q[num_decode:], k_cache, v_cache, meta.prefill_block_tables, meta.prefill_cu_seqlens_q,
                meta.prefill_seq_lens, self.scale,
            )
        return F.linear(out.reshape(num_tokens, self.q_size), layer.o_proj)  # [T, H]
