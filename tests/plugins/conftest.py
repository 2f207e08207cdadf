"""Fixtures shared by the plugins' tests: the `anyio` tests here run on asyncio."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
