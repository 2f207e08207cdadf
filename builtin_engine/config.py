"""Engine settings, each with a default that works for the bundled small model on a CPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    # Where and how the engine runs, resolved at start-up by `builtin_engine.runner.device`:
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"; auto: the first GPU torch sees, else the CPU
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # weights, activations, KV cache, lm_head;
    # auto: bfloat16 on CUDA, float32 on the CPU
    compile: bool | None = None  # the decode step as a prepared graph (CPU: torch.compile, CUDA: CUDA
    # graphs); None: on for bfloat16 on the CPU and on CUDA, off for float32 on the CPU (which starts
    # faster that way; compiled, it keeps its tokens and decodes ~10% faster)
    # Batch sizes CUDA graphs are captured for (a step pads to the next); None: 1, 2, 4, 8, then
    # multiples of 8 up to max_num_seqs. The CPU graph takes any batch size of 2 or more.
    cuda_graph_batch_sizes: tuple[int, ...] | None = None
    # Precision of the decoder layers' projections (q/k/v, o, gate/up, down); None: `dtype`.
    # "bfloat16" with dtype "float32" stores those matrices in bfloat16 and rounds their inputs and
    # outputs to it; embedding, norms, attention, residual stream, KV cache and lm_head (logits)
    # stay float32. With AMX, the projections run ~2x faster at one decoding stream and ~5x at 32
    # (oneDNN-packed matrices); not token-exact against a float32 reference (see
    # `builtin_engine.model.llama.LlamaModel`).
    matmul_dtype: Literal["float32", "bfloat16"] | None = None
    # Longest prompt + completion; None: the model's max_position_embeddings, capped by the KV
    # cache (and a sliding window, when the model has one).
    max_model_len: int | None = None
    max_num_seqs: int = 64  # sequences in one step's batch
    # tokens per step; longer prompts are prefilled in chunks. None: 256 on the CPU, where a step's
    # time grows with its tokens, 8192 on CUDA, where a step of 64 prompts of 128 tokens is one launch
    max_num_batched_tokens: int | None = None
    block_size: int = 16  # tokens per KV cache block
    kv_cache_tokens: int = 16384  # KV cache capacity in tokens, over all sequences
    max_waiting: int = 256  # requests admitted but not yet scheduled; more raise QueueFull
    enable_prefix_caching: bool = True
    num_threads: int | None = None  # torch intra-op threads; None: leave torch's setting
    logprobs_mode: Literal["raw", "processed"] = "raw"  # see builtin_engine.runner.sampler
    max_top_logprobs: int = 20

    def __post_init__(self) -> None:
        positive = ("max_num_seqs", "max_num_batched_tokens", "block_size", "kv_cache_tokens", "max_waiting")
        for name in positive:
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.kv_cache_tokens < self.block_size:
            raise ValueError(f"kv_cache_tokens ({self.kv_cache_tokens}) is less than one block ({self.block_size})")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2, got {self.max_model_len}")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"dtype must be auto, float32 or bfloat16, got {self.dtype!r}")
        if self.cuda_graph_batch_sizes is not None and (not self.cuda_graph_batch_sizes
                                                        or min(self.cuda_graph_batch_sizes) < 1):
            raise ValueError(f"cuda_graph_batch_sizes must be positive sizes, got {self.cuda_graph_batch_sizes}")
        if self.dtype == "bfloat16" and self.matmul_dtype == "float32":
            raise ValueError("matmul_dtype float32 needs dtype float32 (bfloat16 weights gain nothing from it)")

    @property
    def num_kv_blocks(self) -> int:
        return self.kv_cache_tokens // self.block_size

    def batched_tokens_on(self, device_type: str) -> int:
        """max_num_batched_tokens, or its default for a device of this type ("cpu", "cuda")."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return 8192 if device_type == "cuda" else 256
