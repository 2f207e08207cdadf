"""Shared helpers for the text-side tests of the built-in engine (tokenizer, chat template,
detokenizer, model store). Model fixtures come from `tests.fixtures_models`."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    # Two cores shared with other work: more threads thrash.
    import torch

    torch.set_num_threads(1)
