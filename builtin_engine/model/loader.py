"""Load a Hugging Face checkpoint directory of the Llama family into `LlamaWeights`.

Served: `LlamaForCausalLM` (Llama 2/3, SmolLM), `MistralForCausalLM` (without sliding window
beyond the context), `Qwen2ForCausalLM` (q/k/v biases). Files: `config.json`, optional
`generation_config.json` (EOS ids), and weights as one or more `*.safetensors` files, with or
without `model.safetensors.index.json`. Rope scaling: none, `linear`, `llama3`. Anything else is
refused with an `UnsupportedModelError` naming what is missing or unsupported.

q/k/v and gate/up projections are concatenated at load time, so attention and the MLP each start
with one matmul.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from builtin_engine.errors import UnsupportedModelError

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
SUPPORTED_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_type: str
    rope_parameters: dict[str, Any]
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    eos_token_ids: frozenset[int]  # from config.json and generation_config.json
    sliding_window: int | None = None

    def rope_inv_freq(self) -> torch.Tensor | None:
        """Scaled inverse frequencies for `kernels.make_cos_sin_cache`, or None for plain rope."""
        if self.rope_type == "default":
            return None
        base = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim))
        p = self.rope_parameters
        if self.rope_type == "linear":
            return (base / float(p["factor"])).float()
        # llama3: long wavelengths scaled by `factor`, short ones kept, smooth in between
        factor, low, high = float(p["factor"]), float(p["low_freq_factor"]), float(p["high_freq_factor"])
        old_len = float(p["original_max_position_embeddings"])
        wavelen = 2 * math.pi / base
        scaled = torch.where(wavelen > old_len / low, base / factor, base)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(is_medium, smoothed, scaled).float()


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor  # [H]
    qkv_proj: torch.Tensor  # [(Hq + 2 Hkv) D, H]
    qkv_bias: torch.Tensor | None  # [(Hq + 2 Hkv) D]
    o_proj: torch.Tensor  # [H, Hq D]
    post_attention_norm: torch.Tensor  # [H]
    gate_up_proj: torch.Tensor  # [2 I, H]
    down_proj: torch.Tensor  # [H, I]


@dataclass(slots=True)
class LlamaWeights:
    embed_tokens: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H], the embedding itself when tied

    def to(self, device: torch.device) -> LlamaWeights:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        names = [f.name for f in fields(LayerWeights)]
        layers = [LayerWeights(**{n: move(getattr(layer, n)) for n in names}) for layer in self.layers]
        embed = self.embed_tokens.to(device)
        lm_head = embed if self.lm_head is self.embed_tokens else self.lm_head.to(device)
        return LlamaWeights(embed_tokens=embed, layers=layers, norm=self.norm.to(device), lm_head=lm_head)


def read_model_config(model_dir: Path) -> ModelConfig:
    config = _read_json(model_dir / "config.json", required=True)
    # transformers falls back to `model_type` when `architectures` is absent; so do we
    architectures = config.get("architectures") or [MODEL_TYPES.get(config.get("model_type", ""), "")]
    arch = next((a for a in architectures if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise UnsupportedModelError(
            f"{model_dir}: architecture {config.get('architectures') or config.get('model_type')!r} is not "
            f"supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    family = SUPPORTED_ARCHITECTURES[arch]

    def need(key: str) -> Any:
        if config.get(key) is None:
            raise UnsupportedModelError(f"{model_dir}/config.json: missing `{key}`")
        return config[key]

    hidden, num_heads = int(need("hidden_size")), int(need("num_attention_heads"))
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rope_theta = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    rope_type = str(rope.get("rope_type", rope.get("type", "default")))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"{model_dir}/config.json: rope scaling type {rope_type!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    for key in {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                                   "original_max_position_embeddings")}.get(rope_type, ()):
        if key not in rope:
            raise UnsupportedModelError(f"{model_dir}/config.json: {rope_type} rope scaling lacks `{key}`")
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"{model_dir}/config.json: hidden_act {config['hidden_act']!r} is not supported")
    if config.get("mlp_bias"):
        raise UnsupportedModelError(f"{model_dir}/config.json: mlp_bias is not supported")
    sliding_window = config.get("sliding_window") if (family == "mistral" or config.get("use_sliding_window")) else None

    generation = _read_json(model_dir / "generation_config.json", required=False)
    eos: set[int] = set()
    for source in (config, generation):
        value = source.get("eos_token_id")
        eos.update([value] if isinstance(value, int) else (value or []))

    return ModelConfig(
        architecture=arch,
        vocab_size=int(need("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")),
        num_layers=int(need("num_hidden_layers")),
        num_heads=num_heads,
        num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
        head_dim=int(config.get("head_dim") or hidden // num_heads),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_type=rope_type,
        rope_parameters=rope,
        max_position_embeddings=int(need("max_position_embeddings")),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=family == "qwen2" or bool(config.get("attention_bias", False)),
        eos_token_ids=frozenset(eos),
        sliding_window=int(sliding_window) if sliding_window else None,
    )


def load_weights(model_dir: Path, config: ModelConfig, dtype: str) -> LlamaWeights:
    if dtype not in SUPPORTED_DTYPES:
        raise UnsupportedModelError(f"dtype {dtype!r} is not supported; supported: {', '.join(SUPPORTED_DTYPES)}")
    torch_dtype = SUPPORTED_DTYPES[dtype]
    tensors = _read_safetensors(model_dir)

    def take(name: str) -> torch.Tensor:
        tensor = tensors.pop(name, None)
        if tensor is None:
            raise UnsupportedModelError(f"{model_dir}: checkpoint lacks tensor `{name}`")
        return tensor.to(torch_dtype).contiguous()

    def take_optional(name: str) -> torch.Tensor | None:
        return take(name) if name in tensors else None

    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        q, k, v = (take(f"{p}self_attn.{n}_proj.weight") for n in "qkv")
        biases = [take_optional(f"{p}self_attn.{n}_proj.bias") for n in "qkv"] if config.qkv_bias else []
        if config.qkv_bias and any(b is None for b in biases):
            raise UnsupportedModelError(f"{model_dir}: checkpoint lacks q/k/v biases of layer {i}")
        layers.append(
            LayerWeights(
                input_norm=take(f"{p}input_layernorm.weight"),
                qkv_proj=torch.cat([q, k, v]),
                qkv_bias=torch.cat(biases) if biases else None,  # type: ignore[arg-type]
                o_proj=take(f"{p}self_attn.o_proj.weight"),
                post_attention_norm=take(f"{p}post_attention_layernorm.weight"),
                gate_up_proj=torch.cat([take(f"{p}mlp.gate_proj.weight"), take(f"{p}mlp.up_proj.weight")]),
                down_proj=take(f"{p}mlp.down_proj.weight"),
            )
        )
    embed = take("model.embed_tokens.weight")
    lm_head = take_optional("lm_head.weight")
    if lm_head is None:
        if not config.tie_word_embeddings:
            raise UnsupportedModelError(f"{model_dir}: checkpoint lacks `lm_head.weight` and embeddings are not tied")
        lm_head = embed
    weights = LlamaWeights(embed_tokens=embed, layers=layers, norm=take("model.norm.weight"), lm_head=lm_head)
    _check_shapes(model_dir, config, weights)
    return weights


def _check_shapes(model_dir: Path, c: ModelConfig, w: LlamaWeights) -> None:
    q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    expected = {
        "model.embed_tokens.weight": (w.embed_tokens, (c.vocab_size, c.hidden_size)),
        "lm_head.weight": (w.lm_head, (c.vocab_size, c.hidden_size)),
        "layers[0] q/k/v": (w.layers[0].qkv_proj, (q_size + 2 * kv_size, c.hidden_size)),
        "layers[0] o_proj": (w.layers[0].o_proj, (c.hidden_size, q_size)),
        "layers[0] gate/up": (w.layers[0].gate_up_proj, (2 * c.intermediate_size, c.hidden_size)),
        "layers[0] down_proj": (w.layers[0].down_proj, (c.hidden_size, c.intermediate_size)),
    }
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape) != shape:
            raise UnsupportedModelError(
                f"{model_dir}: `{name}` has shape {tuple(tensor.shape)}, config.json implies {shape}"
            )


def _read_safetensors(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = _read_json(index, required=True).get("weight_map") or {}
        files = sorted({model_dir / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise UnsupportedModelError(f"{model_dir}: shards named in {index.name} are missing: {missing}")
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise UnsupportedModelError(f"{model_dir}: no *.safetensors weights (only safetensors checkpoints are served)")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return tensors


def _read_json(path: Path, *, required: bool) -> dict[str, Any]:
    if not path.exists():
        if required:
            raise UnsupportedModelError(f"{path.parent}: missing {path.name}")
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UnsupportedModelError(f"{path}: not valid JSON ({exc})") from exc
