"""The converted default model answers the France question as measured on this machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from builtin_engine.text.chat_template import ChatTemplate
from builtin_engine.text.detokenizer import IncrementalDetokenizer
from builtin_engine.text.tokenizer import Tokenizer


@pytest.mark.slow
def test_france_greedy(default_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    messages = [{"role": "system", "content": "You are a concise assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
    tokenizer = Tokenizer.from_dir(default_model_dir)
    prompt = tokenizer.encode(ChatTemplate.from_dir(default_model_dir).render(messages), add_special_tokens=False)
    assert len(prompt) == 27

    model = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32)
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=16, do_sample=False)
    generated = out[0, len(prompt):].tolist()
    assert generated[-1] == 2 and 2 in tokenizer.eos_token_ids  # <|im_end|>
    detok = IncrementalDetokenizer(tokenizer, prompt_ids=prompt)
    text = "".join(detok.push(i) for i in generated) + detok.flush()
    assert text == "The capital of France is Paris."
