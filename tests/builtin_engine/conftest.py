"""Helpers for the engine tests: build engines over the model fixtures, run Hugging Face
transformers greedy generation on the same weights, drive the engine by hand."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    import torch

    torch.set_num_threads(1)  # two cores shared with other work: more threads thrash


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path):  # noqa: ANN201
    from builtin_engine.text.tokenizer import Tokenizer

    return Tokenizer.from_dir(tiny_model_dir)


@pytest.fixture(scope="session")
def make_engine(tiny_model_dir: Path, tiny_tokenizer) -> Callable[..., object]:  # noqa: ANN001
    """make_engine(model_dir=tiny, **EngineConfig fields) -> LLMEngine (not started), with a
    detokenizer over the model's tokenizer."""
    from builtin_engine.config import EngineConfig
    from builtin_engine.engine import LLMEngine
    from builtin_engine.text.detokenizer import IncrementalDetokenizer
    from builtin_engine.text.tokenizer import Tokenizer

    def make(model_dir: Path | None = None, **config: object) -> LLMEngine:
        model_dir = model_dir or tiny_model_dir
        tokenizer = tiny_tokenizer if model_dir == tiny_model_dir else Tokenizer.from_dir(model_dir)
        return LLMEngine.from_model_dir(
            model_dir,
            config=EngineConfig(**config),
            eos_token_ids=tokenizer.eos_token_ids,
            detokenizer_factory=lambda prompt, skip: IncrementalDetokenizer(
                tokenizer, skip_special_tokens=skip, prompt_ids=prompt),
        )

    return make


class HFReference:
    """transformers greedy generation, one prompt at a time, memoized. `ignore_eos` lets the end
    token be chosen without stopping there (vLLM's meaning), rather than forbidding it as
    `min_new_tokens` would."""

    def __init__(self, model_dir: Path, dtype: object = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype or torch.float32).eval()
        self._memo: dict[tuple[tuple[int, ...], int, bool], list[int]] = {}

    def greedy(self, prompt: list[int], max_new_tokens: int, *, ignore_eos: bool = False) -> list[int]:
        import torch

        key = (tuple(prompt), max_new_tokens, ignore_eos)
        if key not in self._memo:
            with torch.inference_mode():
                out = self.model.generate(
                    torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                    do_sample=False, max_new_tokens=max_new_tokens, top_k=None, top_p=None, temperature=None,
                    **({"eos_token_id": None} if ignore_eos else {}),
                )
            self._memo[key] = out[0, len(prompt):].tolist()
        return self._memo[key]


@pytest.fixture(scope="session")
def hf_tiny(tiny_model_dir: Path) -> HFReference:
    return HFReference(tiny_model_dir)


def collect(handle) -> tuple[dict[int, list[int]], dict[int, str], list]:  # noqa: ANN001
    """Drain a loop-less handle: token ids and text per choice, and every output."""
    tokens: dict[int, list[int]] = {}
    texts: dict[int, str] = {}
    outputs = []
    while not handle.finished:
        out = handle.get(timeout=120)
        outputs.append(out)
        for choice in out.choices:
            tokens.setdefault(choice.index, []).extend(choice.token_ids)
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    return tokens, texts, outputs
