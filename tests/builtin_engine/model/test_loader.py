"""Checkpoint loading: the Llama family's variants (Qwen2 biases, Mistral, llama3 rope scaling,
sharded files, bfloat16) against transformers, and clear errors for what is not served."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from builtin_engine.errors import UnsupportedModelError
from builtin_engine.model.loader import load_weights, read_model_config
from tests.builtin_engine.conftest import HFReference, collect

PROMPTS = [[5, 17, 300, 2, 9, 44, 81], [7, 7, 8, 120, 3]]


def save_tiny(out: Path, config, *, max_shard_size: str | None = None) -> Path:  # noqa: ANN001
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **kwargs)
    return out


def common(**extra: object) -> dict:
    return dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, max_position_embeddings=256, initializer_range=0.1,
                eos_token_id=None, bos_token_id=None, pad_token_id=None, **extra)


def check_greedy_parity(make_engine, model_dir: Path, **config: object) -> None:  # noqa: ANN001
    from builtin_engine.scheduling.sampling_params import SamplingParams

    engine = make_engine(model_dir, max_num_batched_tokens=8, block_size=4, kv_cache_tokens=256, **config)
    hf = HFReference(model_dir)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    handles = [engine.add_request(p, params) for p in PROMPTS]
    engine.run_until_done()
    for prompt, handle in zip(PROMPTS, handles):
        assert collect(handle)[0][0] == hf.greedy(prompt, 6)


@pytest.fixture
def tokenizerless(monkeypatch, tiny_model_dir):  # noqa: ANN001, ANN201
    """Give a bare checkpoint the tiny model's tokenizer files so make_engine can build it."""

    def add(model_dir: Path) -> Path:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tiny_model_dir / name, model_dir / name)
        return model_dir

    return add


def test_qwen2_biases(tmp_path: Path, make_engine, tokenizerless) -> None:  # noqa: ANN001
    from transformers import Qwen2Config

    model_dir = tokenizerless(save_tiny(tmp_path / "qwen2", Qwen2Config(**common(), rope_theta=1e6)))
    config = read_model_config(model_dir)
    assert config.architecture == "Qwen2ForCausalLM" and config.qkv_bias
    check_greedy_parity(make_engine, model_dir)


def test_mistral(tmp_path: Path, make_engine, tokenizerless) -> None:  # noqa: ANN001
    from transformers import MistralConfig

    model_dir = tokenizerless(save_tiny(tmp_path / "mistral", MistralConfig(**common(), sliding_window=None)))
    check_greedy_parity(make_engine, model_dir)


def test_llama3_rope_scaling_and_shards(tmp_path: Path, make_engine, tokenizerless) -> None:  # noqa: ANN001
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    hf_config = LlamaConfig(**common(), rope_parameters=rope)
    model_dir = tokenizerless(save_tiny(tmp_path / "llama3", hf_config, max_shard_size="200KB"))
    assert (model_dir / "model.safetensors.index.json").exists()
    config = read_model_config(model_dir)
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
    assert torch.allclose(config.rope_inv_freq(), expected.float(), rtol=1e-6)
    check_greedy_parity(make_engine, model_dir)


def test_v4_style_config_keys(tmp_path: Path) -> None:
    """Older checkpoints spell rope as `rope_theta` + `rope_scaling` (with `type`)."""
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
              "intermediate_size": 128, "num_hidden_layers": 1, "vocab_size": 100, "max_position_embeddings": 128,
              "rope_theta": 1234.0, "rope_scaling": {"type": "linear", "factor": 2.0}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    parsed = read_model_config(tmp_path)
    assert parsed.rope_theta == 1234.0 and parsed.rope_type == "linear" and parsed.head_dim == 16
    assert parsed.num_kv_heads == 4 and not parsed.tie_word_embeddings


def test_bfloat16_load(tiny_model_dir: Path) -> None:
    config = read_model_config(tiny_model_dir)
    weights = load_weights(tiny_model_dir, config, "bfloat16")
    assert weights.embed_tokens.dtype == torch.bfloat16 and weights.layers[0].qkv_proj.dtype == torch.bfloat16


def test_bfloat16_engine_runs(make_engine) -> None:  # noqa: ANN001
    from builtin_engine.scheduling.sampling_params import SamplingParams

    engine = make_engine(dtype="bfloat16")
    handle = engine.add_request(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    engine.run_until_done()
    assert len(collect(handle)[0][0]) == 4


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.update(architectures=["GPT2LMHeadModel"], model_type="gpt2"), "GPT2LMHeadModel"),
        (lambda c: c.update(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}), "yarn"),
        (lambda c: c.update(rope_parameters={"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}),
         "low_freq_factor"),
        (lambda c: c.pop("hidden_size"), "hidden_size"),
        (lambda c: c.update(hidden_act="gelu"), "gelu"),
    ],
    ids=["architecture", "rope_type", "rope_key", "missing_key", "activation"],
)
def test_config_errors_name_the_problem(tiny_model_dir: Path, tmp_path: Path, edit, message: str) -> None:  # noqa: ANN001
    config = json.loads((tiny_model_dir / "config.json").read_text())
    edit(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match=message):
        read_model_config(tmp_path)


def test_weight_errors_name_the_problem(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError, match="config.json"):
        read_model_config(tmp_path)
    shutil.copy(tiny_model_dir / "config.json", tmp_path / "config.json")
    config = read_model_config(tmp_path)
    with pytest.raises(UnsupportedModelError, match="safetensors"):
        load_weights(tmp_path, config, "float32")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tiny_model_dir / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(UnsupportedModelError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_weights(tmp_path, config, "float32")
    with pytest.raises(UnsupportedModelError, match="float16"):
        load_weights(tmp_path, config, "float16")
