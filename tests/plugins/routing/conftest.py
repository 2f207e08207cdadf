"""Fixtures for the route strategies' tests; the routed gateways they run come from
`tests.support.routed_gateway`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.routed_gateway import SEED


@pytest.fixture
def seeded_random() -> Iterator[None]:
    import random

    state = random.getstate()
    random.seed(SEED)
    try:
        yield
    finally:
        random.setstate(state)
