"""Shadow copies: a route's requests mirrored to another backend for a fraction of the traffic.
A copy runs as a task of its own; its output is discarded, its failures never reach the client,
the client's request never waits for it, and it is recorded (metrics, request log) as a shadow."""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING

import msgspec

from gateway.flow_control import Ask, Ticket
from gateway.observability.request_log import Attempt
from gateway.service.outcomes import error_label
from gateway.service.request_timer import RequestTimer, is_token_event
from plugins.contract.capabilities import check_capabilities
from plugins.contract.config_types import Target
from plugins.contract.errors import SwitchyardError
from plugins.contract.protocol import Backend, RequestSpec, Usage

if TYPE_CHECKING:
    from gateway.service.gateway import Gateway
    from gateway.service.route_plan import RoutePlan


SHADOW_TENANT = "shadow"  # whose turn a copy takes in a flow-control queue: never the client's


def fork_shadow(gateway: Gateway, spec: RequestSpec, plan: RoutePlan, ask: Ask | None = None) -> None:
    """Mirror `spec` to the route's shadow backend for `shadow.fraction` of requests, unless
    the copies are at their `max_concurrent`, the backend's breaker is open or it is full (its
    flow-control queue has waiters: reason `queue`). `ask`: the request's own, with flow control
    on. The copy's task is one of `gateway.shadow_tasks` (cancelled when the gateway closes)."""
    shadow = plan.shadow
    if shadow is None or (shadow.fraction < 1.0 and random.random() >= shadow.fraction):
        return
    route = plan.route.name
    skipped = gateway.metrics.shadow_skipped
    if len(gateway.shadow_tasks) >= shadow.max_concurrent:
        skipped.labels(route, shadow.backend, "max_concurrent").inc()
        return
    if not gateway.health.can_route(shadow.backend):
        skipped.labels(route, shadow.backend, "circuit_open").inc()
        return
    limiter = gateway.limiters.get(shadow.backend)
    if limiter is not None and not limiter.can_admit_now():
        skipped.labels(route, shadow.backend, "at_capacity").inc()
        return
    queue = gateway.flow.queue_of(shadow.backend) if gateway.flow is not None else None
    if queue is not None and queue.num_waiting:
        skipped.labels(route, shadow.backend, "queue").inc()
        return
    backend = gateway.backends[shadow.backend]
    copy = msgspec.structs.replace(spec, upstream_model=plan.shadow_model, request_id=spec.request_id + "-shadow")
    try:
        check_capabilities(copy, backend.capabilities(), backend.name)
    except SwitchyardError:
        skipped.labels(route, shadow.backend, "unsupported").inc()
        return
    target = Target(backend=shadow.backend, model=plan.shadow_model)
    shadow_ask = None if ask is None else msgspec.structs.replace(ask, tenant=SHADOW_TENANT, weight=1.0, slo_s=None)
    task = asyncio.get_running_loop().create_task(_run(gateway, copy, plan, target, backend, shadow_ask))
    gateway.shadow_tasks.add(task)
    task.add_done_callback(gateway.shadow_tasks.discard)


async def _run(gateway: Gateway, spec: RequestSpec, plan: RoutePlan, target: Target, backend: Backend,
               ask: Ask | None) -> None:
    timer = RequestTimer()
    usage: Usage | None = None
    error: BaseException | None = None
    limiter = gateway.limiters.get(backend.name)
    if limiter is not None and not limiter.try_acquire():
        gateway.metrics.shadow_skipped.labels(plan.route.name, backend.name, "at_capacity").inc()
        return
    queue = gateway.flow.queue_of(backend.name) if gateway.flow is not None else None
    ticket: Ticket | None = None
    if queue is not None:
        ticket = await queue.try_admit(ask or Ask(SHADOW_TENANT, 0, 1))
        if ticket is None:
            gateway.metrics.shadow_skipped.labels(plan.route.name, backend.name, "queue").inc()
            return
    gateway.in_flight[backend.name] = gateway.in_flight.get(backend.name, 0) + 1
    events = backend.generate(spec)
    try:
        async for event in events:
            if isinstance(event, Usage):
                usage = event
            elif is_token_event(event):
                timer.mark_tokens()
    except BaseException as exc:  # recorded below; a shadow's failure goes nowhere else
        error = exc
    finally:
        gateway.in_flight[backend.name] -= 1
        if limiter is not None:
            limiter.release()
        if ticket is not None:
            ticket.release()
        try:
            await events.aclose()  # type: ignore[attr-defined]
        except BaseException:  # noqa: BLE001 - closing a failed shadow must not raise
            pass
        arm = gateway.metrics.arm(plan.route.name, target.backend, shadow=True)
        attempts = [Attempt(backend=target.backend, outcome="ok" if error is None else error_label(error))]
        gateway.record(plan=plan, target=target, spec=spec, arm=arm, timer=timer, usage=usage, error=error, attempts=attempts, shadow=True,
                       replica=getattr(events, "served_by", None))
    if isinstance(error, asyncio.CancelledError):
        raise error
