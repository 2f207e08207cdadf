"""Backend health: a circuit breaker per backend and the periodic probes that feed it.

A breaker is `closed` (routes use the backend) until `failures` consecutive failures open it.
Failed probes count, and so do requests that failed with an upstream error — but requests alone
never open it: when they reach the threshold the monitor probes the backend at once, and the
breaker opens only if that probe fails too. A backend whose health endpoint answers is then
left in rotation, so one poisonous prompt ("query of death") that makes every backend fail
cannot take them all out; a backend that is really down fails its probe and is out within
one probe's time. While `open` the routes skip the backend. After `cooldown_s` the next probe
is the half-open trial: `half_open` while it runs, `closed` if it succeeds, `open` again (a
new cool-down) if it fails. Requests never go to a half-open backend; only the probe tests it.

Everything here runs on the event loop and is plain attribute updates: no locks.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Mapping

from plugins.contract.protocol import Backend

log = logging.getLogger("switchyard.health")


class BreakerState(enum.IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        *,
        failures: int = 3,
        cooldown_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str, BreakerState], None] | None = None,
    ) -> None:
        self.name = name
        self.threshold = failures
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.on_change = on_change
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self.opened_at = 0.0
        self.last_probe_ok: bool | None = None  # None: not probed yet

    @property
    def can_route(self) -> bool:
        return self.state is BreakerState.CLOSED

    def can_try_half_open(self) -> bool:
        """An open breaker whose cool-down has passed: the next probe is its trial."""
        return self.state is BreakerState.OPEN and self.clock() - self.opened_at >= self.cooldown_s

    def seconds_to_trial(self) -> float | None:
        if self.state is not BreakerState.OPEN:
            return None
        return max(0.0, self.opened_at + self.cooldown_s - self.clock())

    def record_success(self) -> None:
        """A probe or a request succeeded. An open breaker stays open (a request that began
        before it opened proves little); only its half-open trial closes it."""
        if self.state is BreakerState.OPEN:
            return
        self.consecutive_failures = 0
        if self.state is BreakerState.HALF_OPEN:
            self._set(BreakerState.CLOSED)

    def record_failure(self, *, confirmed: bool = True) -> bool:
        """A failure; `confirmed` False for a request's failure, which cannot open the breaker
        by itself. Returns True when the threshold is reached unconfirmed (probe now)."""
        self.consecutive_failures += 1
        reached = self.consecutive_failures >= self.threshold
        if self.state is BreakerState.HALF_OPEN or (self.state is BreakerState.CLOSED and reached and confirmed):
            self.opened_at = self.clock()
            self._set(BreakerState.OPEN)
            return False
        return reached and self.state is BreakerState.CLOSED

    def begin_trial(self) -> None:
        self._set(BreakerState.HALF_OPEN)

    def _set(self, state: BreakerState) -> None:
        if state is self.state:
            return
        log.warning("backend %s: circuit %s -> %s (%d consecutive failures)", self.name, self.state.name.lower(),
                    state.name.lower(), self.consecutive_failures)
        self.state = state
        if self.on_change is not None:
            self.on_change(self.name, state)


class HealthMonitor:
    """Probes every backend every `interval_s` (0: never periodically) with `backend.health()`
    bounded by `timeout_s`, and keeps one `CircuitBreaker` per backend."""

    def __init__(
        self,
        backends: Mapping[str, Backend],
        *,
        interval_s: float = 5.0,
        timeout_s: float = 2.0,
        failures: int = 3,
        cooldown_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str, BreakerState], None] | None = None,
        on_probe: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.backends = backends
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.on_probe = on_probe
        self._breaker_args = {"failures": failures, "cooldown_s": cooldown_s, "clock": clock, "on_change": on_change}
        self.breakers: dict[str, CircuitBreaker] = {}
        for name in backends:
            self.watch(name)
        self.probed = False  # at least one round has completed
        self._task: asyncio.Task[None] | None = None
        self._probes: dict[str, asyncio.Task[bool]] = {}

    def watch(self, name: str) -> None:
        """Give `name` (now in `backends`) a breaker: for members that come and go (replicas)."""
        if name not in self.breakers:
            self.breakers[name] = CircuitBreaker(name, **self._breaker_args)  # type: ignore[arg-type]

    def unwatch(self, name: str) -> None:
        """Forget `name` (no longer in `backends`), cancelling a probe of it in flight."""
        self.breakers.pop(name, None)
        task = self._probes.pop(name, None)
        if task is not None:
            task.cancel()

    async def probe(self, name: str) -> bool:
        """One probe of one backend; feeds its breaker unless the breaker is open and still
        cooling down (then the probe is not sent at all)."""
        breaker = self.breakers.get(name)
        if breaker is None:
            return False
        if breaker.state is BreakerState.OPEN:
            if not breaker.can_try_half_open():
                return False
            breaker.begin_trial()
        try:
            ok = await asyncio.wait_for(self.backends[name].health(), self.timeout_s) is True
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a probe that raises is a failed probe, whatever it raised
            log.info("backend %s: health probe failed: %r", name, exc)
            ok = False
        breaker.last_probe_ok = ok
        if ok:
            breaker.record_success()
        else:
            breaker.record_failure()
        if self.on_probe is not None:
            self.on_probe(name, ok)
        return ok

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(name) for name in list(self.backends)))
        self.probed = True

    def start(self) -> None:
        if self.interval_s > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="switchyard-health")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._next_delay())
            try:
                await self.probe_all()
            except Exception:  # never let the prober die; the next round tries again
                log.exception("health probe round failed")

    def _next_delay(self) -> float:
        """The probe interval, or less when an open breaker's cool-down ends sooner."""
        delay = self.interval_s
        for breaker in self.breakers.values():
            trial = breaker.seconds_to_trial()
            if trial is not None:
                delay = min(delay, trial)
        return max(delay, 0.01)

    async def close(self) -> None:
        task, self._task = self._task, None
        tasks = [t for t in (task, *self._probes.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- what the gateway asks --------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether periodic probes run (they do once `start()` ran with `interval_s > 0`)."""
        return self._task is not None

    def can_route(self, backend: str) -> bool:
        breaker = self.breakers.get(backend)
        if breaker is None or breaker.state is BreakerState.CLOSED:
            return True
        if self._task is None and breaker.can_try_half_open():
            self._probe_soon(backend)  # no periodic probes: a request after the cool-down sends the trial
        return False

    def request_failed(self, backend: str) -> None:
        """A request to `backend` failed with an upstream error (before or after its first token)."""
        breaker = self.breakers.get(backend)
        if breaker is not None and breaker.record_failure(confirmed=False):
            self._probe_soon(backend)

    def request_succeeded(self, backend: str) -> None:
        breaker = self.breakers.get(backend)
        if breaker is not None:
            breaker.record_success()

    def _probe_soon(self, backend: str) -> None:
        """One probe of `backend` in a task of its own (at most one at a time per backend)."""
        if backend in self._probes:
            return
        task = asyncio.get_running_loop().create_task(self.probe(backend))
        self._probes[backend] = task
        task.add_done_callback(lambda _: self._probes.pop(backend, None))

    def ready(self) -> bool:
        """At least one backend answered its last probe and its breaker is not open."""
        return any(b.last_probe_ok and b.can_route for b in self.breakers.values())
