"""The Llama-family forward pass over a flattened batch of tokens (decode rows and prefill chunks
together), reading and writing the paged KV cache. Every non-matmul op goes through `kernels`,
which picks Triton on CUDA and the torch reference elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import kernels
from builtin_engine.model import packed_linear
from builtin_engine.model.attention_metadata import AttentionMetadata
from builtin_engine.model.loader import LayerWeights, LlamaWeights, ModelConfig
from builtin_engine.model.packed_linear import PackedMatrix


@dataclass(slots=True)
class KVCache:
    """Per layer, `[num_blocks + 1, block_size, Hkv, D]` key and value tensors: views of head-major
    storage (`[Hkv, num_blocks + 1, block_size, D]` contiguous), so that a sequence's block for one
    head is one contiguous [block_size, D] slab (the torch references gather whole slabs, the C++
    kernels read them in place; the Triton kernels index by strides and take any layout).

    Block `pad_block` (= num_blocks) belongs to no sequence: the padding rows of a compiled or
    captured decode step write and read there."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    pad_block: int

    @classmethod
    def allocate(cls, config: ModelConfig, *, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> KVCache:
        shape = (config.num_kv_heads, num_blocks + 1, block_size, config.head_dim)

        def one() -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device).permute(1, 2, 0, 3)

        return cls(keys=[one() for _ in range(config.num_layers)], values=[one() for _ in range(config.num_layers)],
                   pad_block=num_blocks)


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
    With bfloat16 weights (the fast path) everything is bfloat16, the lm_head included, as in
    transformers and vLLM. On a CPU the projection and lm_head matrices are oneDNN-packed once
    (`builtin_engine.model.packed_linear`): bfloat16 ones where oneDNN has bfloat16 kernels, float32
    ones on x86 with AVX2/AVX-512, where oneDNN's float32 GEMM beats aten's (1.2-2.2x here at 32
    rows); float32 results then differ from `F.linear`'s in the last bits (summation order, as
    `F.linear`'s own do between batch sizes), and the float32 path stays token-exact against
    transformers.
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

    def decode_logits(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                      block_tables: torch.Tensor, seq_lens: torch.Tensor, kv_cache: KVCache) -> torch.Tensor:
        """A decode step as one function of tensors (what torch.compile and CUDA graphs take):
        input_ids, positions, slot_mapping [B], block_tables [B, W] int32, seq_lens [B] int32
        -> logits [B, V] float32."""
        batch, device = input_ids.shape[0], input_ids.device
        meta = AttentionMetadata(
            positions=positions, slot_mapping=slot_mapping, num_decode_tokens=batch, decode_block_tables=block_tables,
            decode_seq_lens=seq_lens,
            prefill_block_tables=torch.zeros((0, block_tables.shape[1]), dtype=torch.int32, device=device),
            prefill_cu_seqlens_q=torch.zeros(1, dtype=torch.int32, device=device),
            prefill_seq_lens=torch.zeros(0, dtype=torch.int32, device=device),
            logits_indices=torch.arange(batch, device=device))
        hidden, residual = self.embed(input_ids), None
        for index in range(self.num_layers):
            hidden, residual = self.layer(index, hidden, residual, meta, kv_cache)
        eps = self.config.rms_norm_eps
        if residual is None:  # a model without layers
            return self.compute_logits(kernels.rms_norm(hidden, self.weights.norm, eps))
        return self.compute_logits(kernels.fused_add_rms_norm(hidden, residual, self.weights.norm, eps)[0])

    def step_logits(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                    block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                    logits_indices: torch.Tensor, kv_cache: KVCache) -> torch.Tensor:
        """Any step as one function of tensors (what `builtin_engine.runner.step_graph` compiles): every
        chunk, one-token ones included, a run of the prefill attention. input_ids, positions,
        slot_mapping [T]; block_tables [B, W] int32, cu_seqlens_q [B + 1] int32, seq_lens [B]
        int32; logits_indices [S] int64 -> logits [S, V] float32."""
        meta = AttentionMetadata(
            positions=positions, slot_mapping=slot_mapping, num_decode_tokens=0,
            decode_block_tables=block_tables[:0], decode_seq_lens=seq_lens[:0], prefill_block_tables=block_tables,
            prefill_cu_seqlens_q=cu_seqlens_q, prefill_seq_lens=seq_lens, logits_indices=logits_indices)
        return self.compute_logits(self.forward(input_ids, meta, kv_cache))

    def _linear(self, x: torch.Tensor, weight: torch.Tensor | PackedMatrix,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, in] @ weight [out, in]^T (+ bias) -> [T, out] in x's dtype. `weight` may be
        oneDNN-packed (see `builtin_engine.model.packed_linear`)."""
        if isinstance(weight, PackedMatrix) and weight.dtype == x.dtype:
            return packed_linear.linear(x, weight, bias)
        if isinstance(weight, PackedMatrix):
            out = packed_linear.linear(x.to(weight.dtype), weight).to(x.dtype)
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
    """A copy whose decoder projection matrices are in `dtype`, oneDNN-packed where that pays (see
    `builtin_engine.model.packed_linear`); norms, biases and the embedding keep their dtype, and so does
    the lm_head (packed too). Matrices already in `dtype` and not packed are shared, not copied."""

    def cast(matrix: torch.Tensor) -> torch.Tensor | PackedMatrix:
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
    return LlamaWeights(embed_tokens=weights.embed_tokens, layers=layers, norm=weights.norm,
                        lm_head=_pack_for_onednn(weights.lm_head))


def _pack_for_onednn(matrix: torch.Tensor) -> torch.Tensor | PackedMatrix:
    """A bfloat16 or float32 CPU matrix packed once for oneDNN (see `builtin_engine.model.packed_linear`),
    or `matrix` itself where oneDNN does not pay."""
    return packed_linear.pack(matrix) if packed_linear.can_pack(matrix) else matrix
