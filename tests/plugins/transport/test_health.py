"""Circuit breakers and health probes: open after N failures, half-open trial after the
cool-down, request failures confirmed by a probe, routes skipping open backends, /ready."""

from __future__ import annotations

import asyncio

import pytest

from gateway.chat_api.encode import collect, open_stream
from plugins.contract.errors import UpstreamError
from plugins.transport.health import BreakerState, CircuitBreaker, HealthMonitor
from tests.support.probes import metric
from tests.support.routed_gateway import backend, config_text, route, running_gateway, spec

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Probed:
    """A backend stand-in whose health answer the test sets."""

    def __init__(self, name: str, healthy: bool = True) -> None:
        self.name = name
        self.healthy = healthy
        self.probes = 0

    async def health(self) -> bool:
        self.probes += 1
        if self.healthy is None:
            raise ConnectionError("refused")
        return self.healthy


def test_breaker_opens_after_n_failures_and_half_opens_after_the_cooldown() -> None:
    clock = Clock()
    changes: list[tuple[str, BreakerState]] = []
    breaker = CircuitBreaker("x", failures=3, cooldown_s=10, clock=clock, on_change=lambda n, s: changes.append((n, s)))
    breaker.record_failure()
    breaker.record_failure()
    breaker.record_success()  # not consecutive
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.can_route
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN and not breaker.can_route
    clock.now += 9.9
    assert not breaker.can_try_half_open()
    clock.now += 0.1
    assert breaker.can_try_half_open()
    breaker.begin_trial()
    breaker.record_failure()  # the trial failed: open again, a new cool-down
    assert breaker.state is BreakerState.OPEN and not breaker.can_try_half_open()
    clock.now += 10
    breaker.begin_trial()
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED and breaker.consecutive_failures == 0
    assert [s for _, s in changes] == [BreakerState.OPEN, BreakerState.HALF_OPEN, BreakerState.OPEN, BreakerState.HALF_OPEN, BreakerState.CLOSED]


def test_request_failures_alone_do_not_open_the_breaker() -> None:
    breaker = CircuitBreaker("x", failures=2)
    assert breaker.record_failure(confirmed=False) is False
    assert breaker.record_failure(confirmed=False) is True  # threshold reached: probe now
    assert breaker.state is BreakerState.CLOSED
    breaker.record_failure()  # the probe failed as well
    assert breaker.state is BreakerState.OPEN


async def test_monitor_probes_open_and_recover() -> None:
    clock = Clock()
    sick, fine = Probed("sick", healthy=None), Probed("fine")
    monitor = HealthMonitor({"sick": sick, "fine": fine}, interval_s=0, failures=2, cooldown_s=5, clock=clock)
    await monitor.probe_all()
    assert monitor.ready() and monitor.can_route("sick")
    await monitor.probe_all()
    assert not monitor.can_route("sick") and monitor.can_route("fine")
    probes = sick.probes
    await monitor.probe_all()  # cooling down: not probed at all
    assert sick.probes == probes
    clock.now += 5
    sick.healthy = True
    assert not monitor.can_route("sick")  # no periodic probes: this request triggers the trial
    await asyncio.sleep(0.01)
    assert monitor.can_route("sick") and monitor.breakers["sick"].state is BreakerState.CLOSED
    fine.healthy = False
    sick.healthy = False
    await monitor.probe_all()
    assert not monitor.ready()  # no backend passed its last probe
    await monitor.close()


async def test_a_request_failure_streak_is_confirmed_by_an_immediate_probe() -> None:
    healthy, dead = Probed("healthy"), Probed("dead", healthy=False)
    monitor = HealthMonitor({"healthy": healthy, "dead": dead}, interval_s=60, failures=3)
    for _ in range(5):
        monitor.request_failed("healthy")
        monitor.request_failed("dead")
    await asyncio.sleep(0.01)
    assert healthy.probes == 1 and dead.probes == 1, "one probe per streak, not one per failure"
    assert monitor.can_route("healthy"), "its probe passed: a poisonous prompt does not take it out"
    assert not monitor.can_route("dead")
    await monitor.close()


ARMS = backend("a", answer_prefix="A") + backend("b", answer_prefix="B")


async def test_routes_skip_open_backends_and_503_when_all_are_open() -> None:
    text = config_text(ARMS, route("ab", [("a", 50), ("b", 50)]), server={"health_interval_s": 0, "breaker_failures": 1})
    async with running_gateway(text) as gateway:
        gateway.health.breakers["a"].record_failure()
        served = {(await collect(gateway, spec("ab"))).backend for _ in range(30)}
        assert served == {"b"}
        gateway.health.breakers["b"].record_failure()
        for run in (collect, open_stream):
            with pytest.raises(UpstreamError) as info:
                await run(gateway, spec("ab"))
            assert info.value.kind == "unavailable" and info.value.code == "no_healthy_backend"
        text = gateway.metrics.render().decode()
        assert metric(text, "switchyard_backend_circuit_state", backend="a") == 2


async def test_ready_reflects_probes_and_breakers() -> None:
    text = config_text(backend("a", healthy=False), backend("b"), server={"health_interval_s": 0, "breaker_failures": 3})
    async with running_gateway(text) as gateway:
        assert await gateway.ready()  # b is healthy
        gateway.backends["b"].options.healthy = False
        assert not await gateway.ready()
        gateway.backends["b"].options.healthy = True
        assert await gateway.ready()
        for _ in range(3):
            gateway.health.breakers["b"].record_failure()  # open: b does not count even though it answers
        assert not await gateway.ready()


async def test_periodic_probes_run_in_the_background_and_stop_on_close() -> None:
    text = config_text(backend("a"), server={"health_interval_s": 0.02, "breaker_failures": 2, "breaker_cooldown_s": 0.05})
    async with running_gateway(text) as gateway:
        assert gateway.health.running
        gateway.backends["a"].options.healthy = False
        for _ in range(100):
            await asyncio.sleep(0.02)
            if not gateway.health.can_route("a"):
                break
        assert not gateway.health.can_route("a")
        gateway.backends["a"].options.healthy = True
        for _ in range(100):  # the half-open trial after the cool-down closes it
            await asyncio.sleep(0.02)
            if gateway.health.can_route("a"):
                break
        assert gateway.health.can_route("a")
    assert not gateway.health.running
