"""Root fixtures. Model fixtures (a tiny random model, the real default model) come from
`tests/fixtures_models.py`."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Triton kernels are tested on CPU through the interpreter; it must be chosen before anything
# imports triton, which any test module may do.
os.environ.setdefault("TRITON_INTERPRET", "1")

pytest_plugins = ["tests.fixtures_models", "switchyard.testing"]  # switchyard.testing: the conformance battery


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", help="long modes of the fuzz and load tests (= SWITCHYARD_LONG=1)")


def pytest_configure(config):
    if config.getoption("--long"):
        os.environ["SWITCHYARD_LONG"] = "1"  # read by the fuzz, property and load tests at import
