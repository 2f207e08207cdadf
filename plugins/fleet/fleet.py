"""A proxy backend's replicas: who they are (discovery), which can take a request (each one's
circuit breaker, draining), which should (the placement policy), and what their engines say
about their load (a scrape loop per replica, off the request path).

The backend asks `choose(spec, tried)` for each attempt and tells `finished(...)` once the
attempt is over; a failure before the first byte may be tried on another replica
(`can_retry`). A replica that leaves discovery is drained: it takes no new request, its
requests in flight finish, then its pool is closed and it is forgotten.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from plugins.contract.errors import BREAKER_KINDS, SwitchyardError, UpstreamError
from plugins.contract.protocol import RequestSpec
from plugins.fleet.balance import make_balancer
from plugins.fleet.balance.base import Choice
from plugins.fleet.discovery import Discovery, DiscoveryError, StaticDiscovery, discovery_for
from plugins.fleet.load_signals import LOAD_SOURCES, LoadSignalError, LoadSource
from plugins.fleet.options import LoadSignalOptions, PrefixCacheOptions, ReplicaBreakerOptions
from plugins.fleet.replica import Replica, ReplicaStats
from plugins.transport import http1
from plugins.transport.health import BreakerState, HealthMonitor

log = logging.getLogger("switchyard.fleet")

STALE_INTERVALS = 3  # a scrape older than this many intervals is stale
UNSUPPORTED_BACKOFF = 30  # intervals to wait before asking again an engine that serves no load source


def failure_kind(error: BaseException | None) -> str | None:
    """The upstream error kind when another replica may be tried after `error`; None when the
    request itself is at fault (the same on every replica) or it is no failure."""
    if not isinstance(error, UpstreamError):
        return None
    if error.kind == "upstream_status" and (error.upstream_status or 500) < 500:
        return None
    return error.kind


def outcome_label(error: BaseException | None) -> str:
    if error is None:
        return "ok"
    if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
        return "cancelled"
    if isinstance(error, UpstreamError):
        return error.kind
    if isinstance(error, SwitchyardError):
        return error.code or "invalid_request"
    return "internal"


class Fleet:
    def __init__(
        self,
        backend: str,
        *,
        discovery: Discovery,
        make_pool: Callable[[str], http1.Pool],
        balance: str = "prefix_cache",
        prefix_cache: PrefixCacheOptions = PrefixCacheOptions(),
        load_signals: LoadSignalOptions = LoadSignalOptions(),
        load_sources: Sequence[LoadSource] = (),
        breaker: ReplicaBreakerOptions = ReplicaBreakerOptions(),
        replica_attempts: int = 3,
        health_path: str = "/health",
        health_timeout_s: float = 2.0,
    ) -> None:
        self.backend = backend
        self.discovery = discovery
        self.make_pool = make_pool
        self.balancer = make_balancer(balance, prefix_cache)
        self.load_signals = load_signals
        self.load_sources = tuple(load_sources)
        self.replica_attempts = replica_attempts
        self.health_path = health_path
        self.replicas: dict[str, Replica] = {}
        self.monitor = HealthMonitor(self.replicas, interval_s=0, timeout_s=health_timeout_s,
                                     failures=breaker.failures, cooldown_s=breaker.cooldown_s)
        self.problem: str | None = None  # why there is no replica to send to (discovery's word)
        self._started = False
        self._discover_task: asyncio.Task[None] | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        if isinstance(discovery, StaticDiscovery):
            self.update(discovery.urls)

    @classmethod
    def from_options(cls, backend: str, options: Any, *, make_pool: Callable[[str], http1.Pool],
                     load_sources: Sequence[str], health_path: str) -> Fleet:
        """The fleet a proxy backend's options (`plugins.proxy.options.ProxyOptions`) describe;
        `load_sources` are the backend type's own, used when `load_signals.source` is "auto"."""
        launch = getattr(options, "launch", None) is not None if "launch" in type(options).__struct_fields__ else None
        discovery = discovery_for(backend, base_url=options.base_url, endpoints=options.endpoints,
                                  discovery=options.discovery, launch=launch)
        source = options.load_signals.source
        names = load_sources if source == "auto" else () if source == "none" else (source,)
        return cls(backend, discovery=discovery, make_pool=make_pool, balance=options.balance,
                   prefix_cache=options.prefix_cache, load_signals=options.load_signals,
                   load_sources=[LOAD_SOURCES[n] for n in names], breaker=options.replica_breaker,
                   replica_attempts=options.replica_attempts, health_path=health_path,
                   health_timeout_s=options.timeouts.health_s)

    # -- membership -------------------------------------------------------------------------

    def update(self, urls: Sequence[str]) -> None:
        """Make the fleet these replicas: new ones join, missing ones drain."""
        wanted = set(urls)
        for url in urls:
            replica = self.replicas.get(url)
            if replica is None:
                replica = Replica(url=url, pool=self.make_pool(url), health_path=self.health_path,
                                  stale_after_s=STALE_INTERVALS * self.load_signals.interval_s)
                self.replicas[url] = replica
                self.monitor.watch(url)
                if self._started:
                    self._start_scraping(replica)
                if self._started or not isinstance(self.discovery, StaticDiscovery):
                    log.info("backend %s: replica %s joined (%s)", self.backend, url, self.discovery.describe())
            elif replica.draining:
                replica.draining = False
                log.info("backend %s: replica %s is listed again; no longer draining", self.backend, url)
        for url, replica in list(self.replicas.items()):
            if url not in wanted and not replica.draining:
                replica.draining = True
                log.info("backend %s: replica %s left %s: draining (%d requests in flight)", self.backend, url,
                         self.discovery.describe(), replica.in_flight)
                if replica.in_flight == 0:
                    self._retire(replica)

    def _retire(self, replica: Replica) -> None:
        """Forget a drained replica and close its pool (in a task of its own)."""
        if self.replicas.get(replica.url) is not replica:
            return
        del self.replicas[replica.url]
        self.monitor.unwatch(replica.url)
        self.balancer.forget(replica.url)
        if replica.scrape_task is not None:
            replica.scrape_task.cancel()
        log.info("backend %s: replica %s drained and closed", self.backend, replica.url)
        try:
            task = asyncio.get_running_loop().create_task(replica.pool.aclose())
        except RuntimeError:  # no loop (a fleet updated before it started): nothing is open yet
            return
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def refresh(self) -> None:
        """Ask discovery once and apply its answer; on failure keep the replicas we have."""
        try:
            urls = await self.discovery.resolve()
        except DiscoveryError as exc:
            self._set_problem(str(exc))
            return
        self._set_problem(None if urls else f"{self.discovery.describe()} lists no replica")
        self.update(urls)

    def _set_problem(self, problem: str | None) -> None:
        if problem is not None and problem != self.problem:
            log.warning("backend %s: %s%s", self.backend, problem, "" if self.replicas else " (no replica to send to)")
        self.problem = problem

    async def _discover_loop(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.refresh()
            except Exception:  # never let discovery die; the next round tries again
                log.exception("backend %s: discovery round failed", self.backend)

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        if not isinstance(self.discovery, StaticDiscovery):
            await self.refresh()
        elif not self.replicas:
            self.problem = "no `base_url`, `endpoints` or `discovery` lists a replica"
        self._started = True
        for replica in self.replicas.values():
            self._start_scraping(replica)
        if self.discovery.interval_s:
            self._discover_task = asyncio.get_running_loop().create_task(self._discover_loop(self.discovery.interval_s))

    async def close(self) -> None:
        tasks = [t for t in (self._discover_task, *(r.scrape_task for r in self.replicas.values())) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.monitor.close()
        await asyncio.gather(*(r.pool.aclose() for r in self.replicas.values()), *self._retiring, return_exceptions=True)
        self._started = False

    # -- placement --------------------------------------------------------------------------

    def routable(self, replica: Replica) -> bool:
        return not replica.draining and self.monitor.can_route(replica.url)

    def routable_replicas(self) -> list[Replica]:
        """The replicas that may take a request now (not draining, breaker not open)."""
        return [r for r in self.replicas.values() if self.routable(r)]

    def choose(self, spec: RequestSpec, tried: Sequence[Replica] = ()) -> Replica:
        """The replica for the next attempt of `spec` (counted in flight until `finished`)."""
        candidates = [r for r in self.replicas.values() if r not in tried and self.routable(r)]
        if not candidates:
            raise self._unavailable()
        if len(self.replicas) == 1 and isinstance(self.discovery, StaticDiscovery):
            choice = Choice(candidates[0], "only")  # a backend of one server: no policy to run
        else:
            choice = self.balancer.choose(spec, candidates)
        choice.candidate.begin(choice.reason)
        return choice.candidate

    def _unavailable(self) -> UpstreamError:
        active = [r for r in self.replicas.values() if not r.draining]
        if not active:
            why = self.problem or "every replica is draining"
            return UpstreamError(f"Backend `{self.backend}` has no replica to send to: {why}.", kind="unavailable")
        return UpstreamError(f"Backend `{self.backend}`: no replica is available (every circuit breaker is open).",
                             kind="unavailable")

    def can_retry(self, error: BaseException, tried: Sequence[Replica]) -> bool:
        """After a failure before the first byte: whether another replica should be tried."""
        if failure_kind(error) is None or len(tried) >= self.replica_attempts:
            return False
        return any(r not in tried and self.routable(r) for r in self.replicas.values())

    def finished(self, replica: Replica, spec: RequestSpec, error: BaseException | None, *, before_first_byte: bool = False) -> None:
        """An attempt on `replica` is over: counts, its breaker, the placement policy."""
        replica.end(outcome_label(error))
        kind = failure_kind(error)
        if error is None:
            self.monitor.request_succeeded(replica.url)
        elif kind is not None and kind in BREAKER_KINDS:
            self.monitor.request_failed(replica.url)
        if kind is not None and before_first_byte:
            self.balancer.failed(spec, replica.url)
        if replica.draining and replica.in_flight == 0:
            self._retire(replica)

    def any_replica(self) -> Replica:
        """A replica for a side request (catalogue, tokenize): the least loaded routable one,
        else any that is not draining (its breaker may not have been asked yet)."""
        routable = self.routable_replicas()
        if routable:
            return min(routable, key=Replica.load)
        active = [r for r in self.replicas.values() if not r.draining]
        if active:
            return active[0]
        raise self._unavailable()

    # -- health and load --------------------------------------------------------------------

    async def health(self) -> bool:
        """Probe every replica (each feeds its own breaker): healthy while one can take requests."""
        active = [url for url, r in self.replicas.items() if not r.draining]
        await asyncio.gather(*(self.monitor.probe(url) for url in active))
        breakers = [self.monitor.breakers.get(url) for url in active]
        return any(b is not None and b.last_probe_ok and b.can_route for b in breakers)

    def load(self) -> float:
        """Requests per routable replica, as routing believes them (inf when none is routable)."""
        loads = [r.load() for r in self.routable_replicas()]
        return sum(loads) / len(loads) if loads else math.inf

    def _start_scraping(self, replica: Replica) -> None:
        if self.load_sources and replica.scrape_task is None:
            replica.scrape_task = asyncio.get_running_loop().create_task(self._scrape_loop(replica))

    async def _scrape_loop(self, replica: Replica) -> None:
        interval = self.load_signals.interval_s
        while True:
            try:
                served = await self._scrape(replica)
            except Exception:  # never let a scrape loop die
                log.exception("backend %s: scraping %s failed", self.backend, replica.url)
                served = True
            await asyncio.sleep(interval if served else interval * UNSUPPORTED_BACKOFF)

    async def _scrape(self, replica: Replica) -> bool:
        """One scrape, starting with the source that answered last. False when the engine
        serves none of the sources (not when it is unreachable: its snapshot just ages)."""
        sources = self.load_sources
        for offset in range(len(sources)):
            index = (replica.load_source + offset) % len(sources)
            source = sources[index]
            try:
                status, body = await replica.get(source.path, max(1.0, self.load_signals.interval_s))
            except (http1.HTTPError, TimeoutError, OSError):
                return True
            if status != 200:
                continue
            try:
                snapshot = source.parse(body.decode("utf-8", "replace"), time.monotonic())
            except LoadSignalError as exc:
                log.debug("backend %s: %s from %s: %s", self.backend, source.name, replica.url, exc)
                continue
            replica.load_source = index
            replica.observe(snapshot)
            return True
        return False

    def stats(self) -> list[ReplicaStats]:
        now = time.monotonic()
        out = []
        for replica in self.replicas.values():
            breaker = self.monitor.breakers.get(replica.url)
            snap = replica.snapshot
            fresh = replica.fresh_snapshot()
            out.append(ReplicaStats(
                backend=self.backend, replica=replica.url, draining=replica.draining, in_flight=replica.in_flight,
                circuit=int(breaker.state) if breaker is not None else int(BreakerState.CLOSED),
                healthy=breaker.last_probe_ok if breaker is not None else None,
                attempts=dict(replica.attempts), routed=dict(replica.routed), load=replica.load(), stale=fresh is None,
                signal_age_s=None if snap is None else now - snap.at,
                running=None if snap is None else snap.running, waiting=None if snap is None else snap.waiting,
                kv_cache_usage=None if snap is None else snap.kv_cache_usage,
                prefix_queried_tokens=None if snap is None else snap.prefix_queried_tokens,
                prefix_hit_tokens=None if snap is None else snap.prefix_hit_tokens,
                cached_blocks=self.balancer.cached_blocks(replica.url),
            ))
        return out
