"""The gateway's state and its request path, free of HTTP: the backends, the routes and the
plugin manager; picking a route's target (routing hook, circuit breakers, fallback); recording a
finished request (metrics, breakers, the request log). Shadow copies: `gateway.service.shadow`,
their tasks held here.

Owned by the app's lifespan (`app.state.gateway`), started once and closed in `finally`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import msgspec
import pluggy

from gateway.config import Config, resolve_backend_options
from gateway.errors import ShuttingDown
from gateway.flow_control import FlowControl, build_flow_control
from gateway.keys import KeyLimiter, build_key_limiter
from gateway.keys.keyring import Redactor, authorization_of
from gateway.observability.metrics import ArmMetrics, Metrics, observe, observe_all
from gateway.observability.replica_load import WORKER_MODES, BackendLoads, ReplicaCollector
from gateway.observability.request_log import Attempt, RequestLog, RequestRecord
from gateway.observability.telemetry import Telemetry, build_telemetry
from gateway.service.admission import BackendLimiter, RouteLimits
from gateway.service.event_pump import EventPump
from gateway.service.model_names import ModelNames
from gateway.service.outcomes import error_label, outcome_of, retry_kind
from gateway.service.request_timer import RequestTimer
from gateway.service.route_plan import RoutePlan, validate_routes
from plugins.contract.config_types import Route, Target
from plugins.contract.errors import BREAKER_KINDS, ModelNotFound, UpstreamError
from plugins.contract.protocol import Backend, ModelInfo, RequestSpec, Usage
from plugins.manager import backend_types, build_plugin_manager, call_first
from plugins.routing.sticky import API_KEY_HASH_HEADER
from plugins.transport.health import HealthMonitor

log = logging.getLogger("switchyard.gateway")

@dataclass
class Resolved:
    route: Route
    target: Target
    backend: Backend


@dataclass
class Gateway:
    config: Config
    pm: pluggy.PluginManager
    backends: dict[str, Backend]
    metrics: Metrics = field(default_factory=Metrics)
    routes: dict[str, Route] = field(default_factory=dict)
    plans: dict[str, RoutePlan] = field(default_factory=dict)
    model_infos: dict[str, ModelInfo] = field(default_factory=dict)
    created: int = field(default_factory=lambda: int(time.time()))
    in_flight: dict[str, int] = field(default_factory=dict)  # per backend, for `least_busy`
    health: HealthMonitor = field(init=False)
    request_log: RequestLog | None = field(init=False, default=None)
    limiters: dict[str, BackendLimiter] = field(init=False, default_factory=dict)  # backends with `max_concurrent`
    flow: FlowControl | None = field(init=False, default=None)  # the backends' queues with `[server.flow_control]` on
    redact: Redactor = field(init=False)  # scrubs every known secret from error messages
    draining: bool = field(init=False, default=False)  # SIGTERM came: no new requests
    key_limiter: KeyLimiter = field(init=False)  # per-key limits (gateway/keys)
    telemetry: Telemetry | None = field(init=False, default=None)  # None: tracing off
    _pumps: set[EventPump] = field(init=False, default_factory=set)  # every request's event pump in flight
    shadow_tasks: set[asyncio.Task[None]] = field(init=False, default_factory=set)  # a route's `shadow` copies in flight
    _in_flight_view: Mapping[str, int] = field(init=False)  # what routing plugins see: read-only, live
    _load_view: Mapping[str, float] = field(init=False)  # each backend's engine-reported load, read on demand
    _cut: asyncio.TimerHandle | None = field(init=False, default=None)
    names: ModelNames = field(init=False)  # the routes' aliases and globs

    def __post_init__(self) -> None:
        self.names = ModelNames(self.config.routes)
        self._in_flight_view = MappingProxyType(self.in_flight)
        self._load_view = BackendLoads(self.backends, self.in_flight)
        self.metrics.show_live(ReplicaCollector(self.backends), WORKER_MODES)
        server = self.config.server
        self.redact = Redactor.from_config(self.config)
        self.key_limiter = build_key_limiter(self.config, self.metrics.registry, lambda model: self.model_card(model)[1])
        self.telemetry = build_telemetry(self.config)
        self.flow = build_flow_control(self.config, self.backends, self.metrics)
        for cfg in self.config.backends:  # with flow control on, `max_concurrent` is its queue's capacity
            if cfg.max_concurrent is not None and cfg.name in self.backends and self.flow is None:
                self.limiters[cfg.name] = BackendLimiter(
                    cfg.name, max_concurrent=cfg.max_concurrent, max_queue=cfg.max_queue, queue_timeout_s=cfg.queue_timeout_s
                )
        self.health = HealthMonitor(
            self.backends,
            interval_s=server.health_interval_s,
            timeout_s=server.health_timeout_s,
            failures=server.breaker_failures,
            cooldown_s=server.breaker_cooldown_s,
            on_change=lambda name, state: self.metrics.circuit_state.labels(name).set(int(state)),
            on_probe=lambda name, ok: self.metrics.backend_healthy.labels(name).set(1 if ok else 0),
        )
        for name in self.backends:
            self.in_flight.setdefault(name, 0)
            self.metrics.circuit_state.labels(name).set(0)
        if server.request_log:
            self.request_log = RequestLog(server.request_log, on_drop=self.metrics.request_log_dropped.inc)
        by_name = {r.name: r for r in self.config.routes}
        for name, route in self.routes.items():
            cfg = by_name.get(name)
            if cfg is None:
                self.plans[name] = RoutePlan.build(route, limits=self.default_limits)
                continue
            self.plans[name] = RoutePlan.build(route, cfg.max_attempts, cfg.shadow, RouteLimits.of(server, cfg))

    @property
    def default_limits(self) -> RouteLimits:
        """The limits of a model served under its own name (no `[[routes]]` table)."""
        return RouteLimits.of(self.config.server)

    @classmethod
    def from_config(cls, config: Config) -> Gateway:
        pm = build_plugin_manager(config.plugins.disable, config.plugins.modules)
        types = backend_types(pm)
        backends = {cfg.name: btype.create(cfg.name, options) for cfg, btype, options in resolve_backend_options(config, types)}
        validate_routes(config, pm)
        return cls(config=config, pm=pm, backends=backends, routes={r.name: r for r in config.routes_resolved()})

    async def start(self) -> None:
        await asyncio.gather(*(backend.start() for backend in self.backends.values()))
        await self.refresh_models()
        await self.health.probe_all()  # so /ready and the breakers are right from the first request
        self.health.start()
        if self.request_log is not None:
            await self.request_log.start()
        await self.key_limiter.start()

    async def refresh_models(self) -> None:
        """Every backend model not named by a route is served under its own id."""
        for name, backend in self.backends.items():
            for info in await backend.models():
                self.model_infos[f"{name}/{info.id}"] = info
                if info.id not in self.routes:
                    route = Route(name=info.id, targets=(Target(backend=name, model=info.id),))
                    self.routes[info.id] = route
                    self.plans[info.id] = RoutePlan.build(route, limits=self.default_limits)
        for name, plan in self.plans.items():  # a route that clamps output limits to its context
            if plan.limits.clamps:
                limits = dataclasses.replace(plan.limits, max_model_len=self.model_card(name)[1])
                self.plans[name] = dataclasses.replace(plan, limits=limits)

    async def close(self) -> None:
        if self._cut is not None:
            self._cut.cancel()
        await self.health.close()
        if self.flow is not None:
            await self.flow.close()
        for task in self.shadow_tasks:
            task.cancel()
        await asyncio.gather(*self.shadow_tasks, return_exceptions=True)
        results = await asyncio.gather(*(b.close() for b in self.backends.values()), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                log.warning("closing a backend failed: %r", result)
        if self.request_log is not None:
            await self.request_log.close()
        await self.key_limiter.close()
        if self.telemetry is not None:
            await asyncio.to_thread(self.telemetry.shutdown)
        self.metrics.close()

    def route_name(self, model: str) -> str | None:
        """The route a client's model name goes to (its own, an alias's, a glob's), or None."""
        return self.names.route_of(model, self.routes)

    def model_card(self, name: str) -> tuple[Route, int | None]:
        route_name = self.route_name(name)
        route = None if route_name is None else self.routes.get(route_name)
        if route is None:
            raise ModelNotFound(name)
        lens = [self.model_infos.get(f"{t.backend}/{t.model}") for t in route.targets]
        known = [info.max_model_len for info in lens if info is not None and info.max_model_len]
        return route, min(known) if known else None

    # -- routing -----------------------------------------------------------------------------

    def plan(self, model: str) -> RoutePlan:
        """The plan of the route a client's model name goes to; `ModelNotFound` when none."""
        plan = self.plans.get(model)
        if plan is None:
            name = self.route_name(model)
            route = None if name is None else self.routes.get(name)
            if route is None:
                raise ModelNotFound(model)
            plan = self.plans.get(route.name)
            if plan is None:
                plan = self.plans[route.name] = RoutePlan.build(route, limits=self.default_limits)
        return plan

    def strips_billing_header(self, model: str) -> bool:
        """Whether requests for `model` lose Claude Code's billing line (`strip_billing_header`:
        the route's, else the server's)."""
        return self.limits_for(model).strip_billing_header

    def limits_for(self, model: str) -> RouteLimits:
        plan = self.plans.get(model)
        if plan is None:
            name = self.route_name(model)
            plan = None if name is None else self.plans.get(name)
        return self.default_limits if plan is None else plan.limits

    # -- draining ------------------------------------------------------------------------------

    def track(self, pump: EventPump) -> None:
        self._pumps.add(pump)

    def untrack(self, pump: EventPump) -> None:
        self._pumps.discard(pump)

    def begin_drain(self, grace_s: float) -> None:
        """SIGTERM: refuse new requests (503); requests in flight may finish for `grace_s`,
        then `cut_in_flight` ends the rest. A second call cuts at once."""
        if self.draining:
            self.cut_in_flight()
            return
        self.draining = True
        log.info("draining: %d requests in flight get %g s to finish", len(self._pumps), grace_s)
        self._cut = asyncio.get_running_loop().call_later(grace_s, self.cut_in_flight)

    def cut_in_flight(self) -> None:
        """End every request still running: streams with an error event, the others with 503."""
        if self._cut is not None:
            self._cut.cancel()
            self._cut = None
        if self._pumps:
            log.warning("drain period over: ending %d requests still in flight", len(self._pumps))
        for pump in list(self._pumps):
            pump.interrupt(ShuttingDown("The server shut down before the request completed."))
        for limiter in self.limiters.values():
            limiter.fail_waiters(ShuttingDown())
        if self.flow is not None:
            self.flow.fail_waiters(ShuttingDown())

    def with_routing_keys(self, spec: RequestSpec, headers: Mapping[str, str]) -> RequestSpec:
        """`spec` with the client headers its route keys on (a sticky route's `header:` sources)
        copied into `spec.headers`, and a SHA-256 of the client's bearer token when the route
        keys on `api_key` (or on Anthropic's `x-api-key`). Credentials themselves are never copied."""
        plan = self.plans.get(spec.model)
        if plan is None and (name := self.route_name(spec.model)) is not None:
            plan = self.plans.get(name)
        if plan is None or not (plan.key_headers or plan.key_api_key):
            return spec
        copied: dict[str, str] = {}
        for name in plan.key_headers:
            value = headers.get(name)
            if value:
                copied[name] = value
        if plan.key_api_key:
            scheme, _, token = authorization_of(headers).partition(" ")
            token = token.strip()
            if scheme.lower() == "bearer" and token:
                copied[API_KEY_HASH_HEADER] = hashlib.sha256(token.encode()).hexdigest()
        return msgspec.structs.replace(spec, headers=copied) if copied else spec

    def pick(self, spec: RequestSpec, plan: RoutePlan, tried: list[Target] | None = None) -> Resolved | None:
        """The target the routing hook picks among the route's targets whose breakers are not
        open, less those already `tried`. None when no target is left after a failed attempt;
        503 when every backend of the route is open."""
        route = plan.route
        health = self.health
        candidates = [t for t in route.targets if health.can_route(t.backend) and (not tried or t not in tried)]
        if not candidates:
            if tried:
                return None
            raise UpstreamError(
                f"No backend of `{route.name}` is available: every circuit breaker is open.", kind="unavailable", code="no_healthy_backend"
            )
        target = call_first(self.pm.hook.switchyard_route, spec=spec, route=route, candidates=candidates,
                            in_flight=self._in_flight_view, load=self._load_view)
        if target is None:
            raise UpstreamError(f"No routing plugin picked a backend for model `{spec.model}`.", kind="unavailable")
        return Resolved(route=route, target=target, backend=self.backends[target.backend])

    def resolve(self, spec: RequestSpec) -> Resolved:
        """The first pick for `spec` (the token endpoints; requests go through `pick`)."""
        resolved = self.pick(spec, self.plan(spec.model))
        assert resolved is not None
        return resolved

    async def ready(self) -> bool:
        """Ready when some backend passed its last probe and its breaker is not open. Without
        periodic probes (`health_interval_s = 0`) each call probes every backend."""
        if not self.health.running:
            await self.health.probe_all()
        return self.health.ready()

    # -- after a request -------------------------------------------------------------------

    def record(
        self,
        *,
        plan: RoutePlan,
        target: Target,
        spec: RequestSpec,
        arm: ArmMetrics,
        timer: RequestTimer,
        usage: Usage | None,
        error: BaseException | None,
        attempts: list[Attempt],
        shadow: bool = False,
        replica: str | None = None,
        queued_ms: int | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """Metrics, the backend's breaker and the request log for one finished request (or
        shadow copy); `replica`: the one that served (or was tried last), when the backend has
        replicas; `queued_ms`: how long it waited in flow-control queues (None: it did not).
        Returns the outcome and the timings (for the `on_response` hook)."""
        outcome = outcome_of(error)
        arm.finished(outcome)
        timings = timer.as_dict()
        observe(arm.e2e, timings["e2e"])
        if timings["ttft"] is not None:
            observe(arm.ttft, timings["ttft"])
        observe_all(arm.itl, timings["itl"])
        if usage is not None:
            arm.prompt.inc(usage.prompt_tokens)
            arm.completion.inc(usage.completion_tokens)
            if usage.cached_tokens:
                arm.cached.inc(usage.cached_tokens)
        label = None
        if error is not None and outcome != "cancelled":
            label = error_label(error)
            arm.failed(label)
            if retry_kind(error) in BREAKER_KINDS:
                self.health.request_failed(target.backend)
        elif error is None:
            self.health.request_succeeded(target.backend)
        if self.request_log is not None:
            self.request_log.add(
                RequestRecord(
                    ts=timer.wall_start,
                    request_id=spec.request_id,
                    route=plan.route.name,
                    arm=plan.arm(target),
                    backend=target.backend,
                    model=spec.upstream_model,
                    shadow=shadow,
                    kind=spec.kind,
                    stream=spec.stream,
                    outcome=outcome,
                    error=label,
                    ttft=timings["ttft"],
                    e2e=timings["e2e"],
                    itl=timings["itl"],
                    prompt_tokens=None if usage is None else usage.prompt_tokens,
                    completion_tokens=None if usage is None else usage.completion_tokens,
                    cached_tokens=None if usage is None else usage.cached_tokens,
                    attempts=attempts,
                    prompt=(spec.messages if spec.messages is not None else spec.prompt) if self.config.server.log_prompts else None,
                    replica=replica,
                    queued_ms=queued_ms,
                    session=spec.session,
                )
            )
        return outcome, timings

    def record_failed_attempt(self, plan: RoutePlan, target: Target, error: BaseException) -> str:
        """A target failed before its first token and the request moves on: count it, feed the
        backend's breaker, log it. Returns the attempt's outcome label."""
        kind = retry_kind(error) or error_label(error)
        self.metrics.attempts.labels(plan.route.name, target.backend, kind).inc()
        if kind in BREAKER_KINDS:
            self.health.request_failed(target.backend)
        log.warning("route %s: backend %s failed before the first token (%s: %s); trying the next target",
                    plan.route.name, target.backend, kind, getattr(error, "message", error))
        return kind
