"""The gateway's state and its request path, free of HTTP: the backends, the routes and the
plugin manager; resolving a model name to a backend; running a request into events.

Owned by the app's lifespan (`app.state.gateway`), started once and closed in `finally`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pluggy

from gateway.config import Config, resolve_backend_options
from gateway.metrics import Metrics
from plugins.errors import ConfigError, ModelNotFound, SwitchyardError, UpstreamError
from plugins.manager import backend_types, build_plugin_manager
from plugins.protocol import Backend, Event, ModelInfo, RequestSpec, TextDelta, Usage
from plugins.registry import Route, Target

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
    model_infos: dict[str, ModelInfo] = field(default_factory=dict)
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def from_config(cls, config: Config) -> Gateway:
        pm = build_plugin_manager(config.plugins.disable, config.plugins.modules)
        types = backend_types(pm)
        backends = {cfg.name: btype.create(cfg.name, options) for cfg, btype, options in resolve_backend_options(config, types)}
        strategies = {name for names in pm.hook.switchyard_route_strategies() for name in names}
        for i, route in enumerate(config.routes):
            if route.strategy not in strategies:
                raise ConfigError(
                    f"{config.source}: unknown routing strategy {route.strategy!r} at `routes[{i}].strategy` "
                    f"(known: {', '.join(sorted(strategies))})"
                )
        return cls(config=config, pm=pm, backends=backends, routes={r.name: r for r in config.routes_resolved()})

    async def start(self) -> None:
        await asyncio.gather(*(backend.start() for backend in self.backends.values()))
        await self.refresh_models()

    async def refresh_models(self) -> None:
        """Every backend model not named by a route is served under its own id."""
        for name, backend in self.backends.items():
            for info in await backend.models():
                self.model_infos[f"{name}/{info.id}"] = info
                if info.id not in self.routes:
                    self.routes[info.id] = Route(name=info.id, targets=(Target(backend=name, model=info.id),))

    async def close(self) -> None:
        results = await asyncio.gather(*(b.close() for b in self.backends.values()), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                log.warning("closing a backend failed: %r", result)

    def model_card(self, name: str) -> tuple[Route, int | None]:
        route = self.routes.get(name)
        if route is None:
            raise ModelNotFound(name)
        lens = [self.model_infos.get(f"{t.backend}/{t.model}") for t in route.targets]
        known = [info.max_model_len for info in lens if info is not None and info.max_model_len]
        return route, min(known) if known else None

    def resolve(self, spec: RequestSpec) -> Resolved:
        route = self.routes.get(spec.model)
        if route is None:
            raise ModelNotFound(spec.model)
        target = self.pm.hook.switchyard_route(spec=spec, route=route, candidates=list(route.targets))
        if target is None:
            raise UpstreamError(f"No backend is available for model `{spec.model}`.", kind="unavailable")
        return Resolved(route=route, target=target, backend=self.backends[target.backend])

    async def ready(self) -> bool:
        results = await asyncio.gather(*(b.health() for b in self.backends.values()), return_exceptions=True)
        return any(r is True for r in results)


class EventPump:
    """Runs a backend's event iterator in its own task and hands the consumer every event that
    is ready at once, so that a `Finish` yielded right after the last `TextDelta` can ride on
    the same chunk without holding any text back to wait for it.

    `close()` cancels the task, which closes the backend's iterator (its `finally` aborts the
    request upstream or in the engine)."""

    def __init__(self, events: AsyncIterator[Event]) -> None:
        self._events = events
        self._buffer: list[Event] = []
        self._error: BaseException | None = None
        self._done = False
        self._waiter: asyncio.Future[None] | None = None
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            async for event in self._events:
                self._buffer.append(event)
                self._wake()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the consumer, who raises it
            self._error = exc
        finally:
            self._done = True
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_batch(self) -> list[Event] | None:
        """The events ready now (waiting for at least one); None when the stream has ended."""
        while not self._buffer:
            if self._done:
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None
        batch, self._buffer = self._buffer, []
        return batch

    async def close(self) -> None:
        if not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


@dataclass
class RequestTimer:
    """Wall-clock marks of one request, for metrics and the `on_response` hook."""

    start: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    last_token: float | None = None
    itl: list[float] = field(default_factory=list)

    def mark_tokens(self) -> None:
        now = time.perf_counter()
        if self.first_token is None:
            self.first_token = now
        elif self.last_token is not None:
            self.itl.append(now - self.last_token)
        self.last_token = now

    def as_dict(self) -> dict[str, Any]:
        end = time.perf_counter()
        ttft = None if self.first_token is None else self.first_token - self.start
        return {"ttft": ttft, "e2e": end - self.start, "itl": self.itl}


def outcome_of(error: BaseException | None) -> str:
    if error is None:
        return "ok"
    if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
        return "cancelled"
    if isinstance(error, SwitchyardError):
        return f"error:{type(error).__name__}"
    return "error:InternalError"


def check_usage(usage: Usage | None, backend: str) -> Usage:
    if usage is None:
        raise UpstreamError(f"Backend `{backend}` ended the response without usage.", kind="bad_gateway")
    if usage.prompt_tokens < 0 or usage.completion_tokens < 0:
        raise UpstreamError(f"Backend `{backend}` reported negative token counts.", kind="bad_gateway")
    return usage


def is_token_event(event: Event) -> bool:
    return not isinstance(event, Usage) and (not isinstance(event, TextDelta) or bool(event.text or event.logprobs))
