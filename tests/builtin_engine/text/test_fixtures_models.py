"""The tiny test models load with transformers and with the engine's own text modules."""

from __future__ import annotations

import json
from pathlib import Path

from builtin_engine.text.chat_template import ChatTemplate
from builtin_engine.text.tokenizer import Tokenizer
from tests.fixtures_models import BOS, EOS, EOT, cached_tiny_model


def _check_tiny(model_dir: Path, *, tied: bool) -> None:
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((model_dir / "config.json").read_text())
    tokenizer = Tokenizer.from_dir(model_dir)
    assert config["vocab_size"] == tokenizer.vocab_size == len(AutoTokenizer.from_pretrained(model_dir))
    assert 1000 <= tokenizer.vocab_size <= 2000
    assert (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"],
            config["head_dim"], config["intermediate_size"]) == (128, 4, 2, 32, 256)
    assert config["tie_word_embeddings"] is tied and config["dtype"] == "float32"
    with safe_open(str(model_dir / "model.safetensors"), "pt") as weights:
        assert ("lm_head.weight" in weights.keys()) is not tied
        assert weights.get_tensor("model.embed_tokens.weight").dtype == torch.float32
    eos_ids = {tokenizer.token_to_id(EOS), tokenizer.token_to_id(EOT)}
    assert set(json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"]) == eos_ids
    assert tokenizer.eos_token_ids == eos_ids

    prompt = ChatTemplate.from_dir(model_dir).render([{"role": "user", "content": "Hi"}])
    assert prompt.startswith(BOS) and prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert out.shape == (1, len(ids) + 5)


def test_tiny_model(tiny_model_dir: Path) -> None:
    _check_tiny(tiny_model_dir, tied=False)


def test_tiny_model_tied(tiny_model_dir_tied: Path) -> None:
    _check_tiny(tiny_model_dir_tied, tied=True)


def test_tiny_model_is_cached_across_sessions(tiny_model_dir: Path) -> None:
    cached = cached_tiny_model()
    assert (cached / ".complete").is_file()
    assert cached_tiny_model() == cached  # no rebuild
    for name in ("tokenizer.json", "model.safetensors"):
        assert (cached / name).read_bytes() == (tiny_model_dir / name).read_bytes()
