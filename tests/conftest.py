"""Root fixtures. Model fixtures (a tiny random model, the real default model) come from
`tests/fixtures_models.py`."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Triton kernels are tested on CPU through the interpreter; it must be chosen before anything
# imports triton, which any test module may do.
os.environ.setdefault("TRITON_INTERPRET", "1")

pytest_plugins = ["tests.fixtures_models"]
