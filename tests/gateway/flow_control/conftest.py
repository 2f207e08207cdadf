"""Fixtures for the flow-control tests: the real redis-server of the per-key limit tests (one
per session, emptied before each test that asks for it) and a clock the tests move by hand."""

from __future__ import annotations

import pytest

from tests.gateway.keys.conftest import FakeClock, redis, redis_session  # noqa: F401  (fixtures)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
