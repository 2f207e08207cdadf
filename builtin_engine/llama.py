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
    """Per layer, `[num_blocks, block_size, Hkv, D]` key and value tensors: views of head-major
    storage (`[Hkv, num_blocks, block_size, D]` contiguous), so that gathering a sequence's
    blocks for one head copies whole [block_size, D] slabs (the torch references' fast path;
    the Triton kernels index by strides and take any layout)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @classmethod
    def allocate(cls, config: ModelConfig, *, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> KVCache:
        shape = (config.num_kv_heads, num_blocks, block_size, config.head_dim)

        def one() -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device).permute(1, 2, 0, 3)

        return cls(keys=[one() for _ in range(config.num_layers)], values=[one() for _ in range(config.num_layers)])


class LlamaModel:
    """`forward` runs the whole pass; `embed`, `layer` and `final_norm` are its parts, for a caller
    that acts between layers (the model runner drops aborted rows there).

    `matmul_dtype` (default: the weights' dtype) is the precision of the decoder layers'
    projections: bfloat16 over float32 weights stores the q/k/v, o, gate/up and down matrices in
    bfloat16 and rounds each projection's input and output to bfloat16, while the embedding,
    norms, rotary, attention, the residual stream, the KV cache and the lm_head (so the logits)
    stay float32. Logits rounded to bfloat16 would tie tokens whose logits differ by up to 1/16
    and blur logprobs; the float32 lm_head costs ~15% of a 32-stream decode step on a 2-core
    Xeon with AMX (40% of its matmul time, the packed bfloat16 projections taking the rest).
    Bfloat16 projection matrices on a CPU are oneDNN-packed once (see `_pack_for_onednn`).
    """

    def __init__(self, config: ModelConfig, weights: LlamaWeights, *, max_positions: int,
                 matmul_dtype: torch.dtype | None = None) -> None:
        self.config = config
        self.device = weights.embed_tokens.device
        self.dtype = weights.embed_tokens.dtype  # activations and the KV cache
        self.matmul_dtype = matmul_dtype or self.dtype
        self.weights = _cast_projections(weights, self.matmul_dtype)
        self.scale = config.head_dim**-0.5
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        inv_freq = config.rope_inv_freq()
        self.cos_sin_cache = kernels.make_cos_sin_cache(
            max_positions, config.head_dim, config.rope_theta, device=self.device,
            inv_freq=None if inv_freq is None else inv_freq.to(self.device),
        )  # [max_positions, D] float32

    @property
    def num_layers(self) -> int:
        return len(self.weights.layers)

    def forward(self, input_ids: torch.Tensor, meta: AttentionMetadata, kv_cache: KVCache) -> torch.Tensor:
        """input_ids [T] int64 -> final-normed hidden states of the `meta.logits_indices` rows [S, H]."""
        hidden, residual = self.embed(input_ids), None
        for index in range(self.num_layers):
            hidden, residual = self.layer(index, hidden, residual, meta, kv_cache)
        return self.final_norm(hidden, residual, meta.logits_indices)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] int64 -> [T, H], the first layer's `hidden` (its `residual` is None)."""
        return F.embedding(input_ids, self.weights.embed_tokens)

    def layer(self, index: int, hidden: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata,
              kv_cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder layer `index`: (hidden [T, H], residual [T, H] or None) -> the next pair."""
        layer = self.weights.layers[index]
        eps = self.config.rms_norm_eps
        if residual is None:
            residual = hidden
            hidden = kernels.rms_norm(hidden, layer.input_norm, eps)
        else:
            hidden, residual = kernels.fused_add_rms_norm(hidden, residual, layer.input_norm, eps)
        hidden = self._attention(layer, hidden, meta, kv_cache.keys[index], kv_cache.values[index])
        hidden, residual = kernels.fused_add_rms_norm(hidden, residual, layer.post_attention_norm, eps)
        gate_up = self._linear(hidden, layer.gate_up_proj)  # [T, 2I]
        hidden = self._linear(kernels.silu_and_mul(gate_up), layer.down_proj)  # [T, H]
        return hidden, residual

    def final_norm(self, hidden: torch.Tensor, residual: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
        """The last layer's pair -> final-normed hidden states of `rows` ([S] int64) [S, H]."""
        eps = self.config.rms_norm_eps
        if residual is None:  # a model without layers
            return kernels.rms_norm(hidden[rows], self.weights.norm, eps)
        hidden, _ = kernels.fused_add_rms_norm(hidden[rows], residual[rows], self.weights.norm, eps)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[S, H] -> [S, V] float32."""
        return self._linear(hidden, self.weights.lm_head).float()

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, in] @ weight [out, in]^T (+ bias) -> [T, out] in x's dtype. `weight` may be
        oneDNN-packed (see `_pack_for_onednn`)."""
        if weight.is_mkldnn and weight.dtype == x.dtype:
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        if weight.is_mkldnn:
            out = torch.ops.mkldnn._linear_pointwise(x.to(weight.dtype), weight, None, "none", [], "").to(x.dtype)
        elif weight.dtype == x.dtype:
            return F.linear(x, weight, bias)
        else:
            out = F.linear(x.to(weight.dtype), weight).to(x.dtype)
        return out if bias is None else out.add_(bias)

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
        qkv = self._linear(hidden, layer.qkv_proj, layer.qkv_bias)  # [T, (Hq + 2 Hkv) D]
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
        return self._linear(out.reshape(num_tokens, self.q_size), layer.o_proj)  # [T, H]


def _cast_projections(weights: LlamaWeights, dtype: torch.dtype) -> LlamaWeights:
    """A copy whose decoder projection matrices are in `dtype` (oneDNN-packed where that pays);
    norms, biases, the embedding and the lm_head keep theirs. Matrices already in `dtype` and
    not packed are shared, not copied."""

    def cast(matrix: torch.Tensor) -> torch.Tensor:
        return _pack_for_onednn(matrix.to(dtype))

    layers = [
        LayerWeights(
            input_norm=layer.input_norm,
            qkv_proj=cast(layer.qkv_proj),
            qkv_bias=layer.qkv_bias,
            o_proj=cast(layer.o_proj),
            post_attention_norm=layer.post_attention_norm,
            gate_up_proj=cast(layer.gate_up_proj),
            down_proj=cast(layer.down_proj),
        )
        for layer in weights.layers
    ]
    return LlamaWeights(embed_tokens=weights.embed_tokens, layers=layers, norm=weights.norm, lm_head=weights.lm_head)


def _pack_for_onednn(matrix: torch.Tensor) -> torch.Tensor:
    """A bfloat16 CPU matrix [out, in] reordered once into oneDNN's blocked layout (AMX tiles
    where the CPU has them), or `matrix` itself elsewhere. `F.linear` on a bfloat16 CPU matrix
    goes through the same oneDNN kernel but reorders the weights on every call: packed, the
    projections ran ~1.7x faster at 32 rows, with bit-identical results."""
    if (matrix.dtype != torch.bfloat16 or matrix.device.type != "cpu" or not torch.backends.mkldnn.is_available()
            or not torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return matrix
    return torch.ops.mkldnn._reorder_linear_weight(matrix, None)
