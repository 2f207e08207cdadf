"""Fixtures for the route strategies' tests: `seeded_random` from the routed gateways they run
(`tests.support.routed_gateway`)."""

from tests.support.routed_gateway import seeded_random  # noqa: F401 - a fixture
