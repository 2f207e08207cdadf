"""Root fixtures. Model fixtures (a tiny random model, the real default model) come from
`tests/fixtures_models.py`."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

pytest_plugins = ["tests.fixtures_models"]
