"""Fixtures for the per-key limit tests: a real redis-server on a free loopback port (one per
session, emptied before each test that asks for it), and a clock the tests move by hand.
tests/e2e/test_limits_e2e.py imports the Redis fixtures (and so starts a redis-server of its own)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.support.redis_server import INSTALL_HINT, RedisServer, redis_installed


class FakeClock:
    """Epoch seconds that move only when told; starts at the real time (Redis expiries of the
    budget counters are real-time, so the fake time must not lie in the past)."""

    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def redis_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if not redis_installed():
        pytest.skip(f"redis-server is not installed; run `{INSTALL_HINT}`")
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis(redis_session: RedisServer) -> RedisServer:
    """The session's Redis, running and empty."""
    if not redis_session.ping():
        redis_session.start()
    redis_session.command("FLUSHALL")
    return redis_session


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
