"""`plugins.manager.call_first` answers a `firstresult` hook as pluggy does: the one
implementation called directly, several (or a wrapper) through pluggy in its order."""

from __future__ import annotations

import pluggy
import pytest

from plugins import hookimpl
from plugins.contract import hookspecs
from plugins.contract.config_types import Route, Target
from plugins.manager import build_plugin_manager, call_first

ROUTE = Route(name="r", targets=(Target(backend="a", model="m"), Target(backend="b", model="m")), strategy="fallback")


class Second:
    @hookimpl
    def switchyard_route(self, candidates: list[Target]) -> Target | None:
        return candidates[-1]


class Refuses:
    @hookimpl
    def switchyard_route(self, route: Route) -> Target | None:
        raise LookupError(route.name)


class Wrapper:
    @hookimpl(wrapper=True)
    def switchyard_route(self, candidates: list[Target]):  # type: ignore[no-untyped-def]
        result = yield
        return candidates[0] if result == candidates[-1] else result


def _manager(*plugins: object) -> pluggy.PluginManager:
    pm = pluggy.PluginManager("switchyard")
    pm.add_hookspecs(hookspecs)
    for plugin in plugins:
        pm.register(plugin)
    return pm


def _route(pm: pluggy.PluginManager) -> tuple[object, object]:
    kwargs = dict(spec=None, route=ROUTE, candidates=list(ROUTE.targets), in_flight={}, load={})
    return call_first(pm.hook.switchyard_route, **kwargs), pm.hook.switchyard_route(**kwargs)


@pytest.mark.parametrize("plugins", [(Second(),), (Second(), Wrapper()), (Refuses(), Second()), ()])
def test_the_same_answer_as_pluggy(plugins: tuple[object, ...]) -> None:
    direct, pluggys = _route(_manager(*plugins))
    assert direct is pluggys


def test_the_same_exception_as_pluggy() -> None:
    pm = _manager(Second(), Refuses())  # the last registered is called first
    for call in (lambda: _route(pm), lambda: call_first(pm.hook.switchyard_route, spec=None, route=ROUTE,
                                                      candidates=list(ROUTE.targets), in_flight={}, load={})):
        with pytest.raises(LookupError, match="^r$"):
            call()
    with pytest.raises(LookupError, match="^r$"):
        call_first(_manager(Refuses()).hook.switchyard_route, spec=None, route=ROUTE, candidates=list(ROUTE.targets),
                   in_flight={}, load={})


def test_the_built_in_routing_is_called_directly() -> None:
    pm = build_plugin_manager(disable=["builtin"])
    assert len(pm.hook.switchyard_route.get_hookimpls()) == 1
    direct, pluggys = _route(pm)
    assert direct == pluggys == ROUTE.targets[0]  # the `fallback` strategy's first target
