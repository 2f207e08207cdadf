"""The battery as pytest tests.

Command line: `pytest -p switchyard.testing --switchyard-backend=TYPE --switchyard-options='{...}'`
adds one test per check, `switchyard::<check>`, against a backend of that type (a failure shows
its verdict, fix and events).

Fixtures, for an author's own tests: override `switchyard_subject` (module scope; parametrize it
to test several configurations) and write

    def test_conformance(switchyard_battery, switchyard_check):
        switchyard_battery.assert_passes(switchyard_check)

— `switchyard_check` is parametrized over every check, in the battery's order.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from plugins.contract.errors import ConfigError
from plugins.testing.registry import Verdict, ordered
from plugins.testing.report import format_verdict
from plugins.testing.subject import Subject
from switchyard.testing import Battery

BATTERY_KEY = pytest.StashKey["SyncBattery"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("switchyard", "Switchyard backend conformance battery")
    group.addoption("--switchyard-backend", metavar="TYPE", default=None,
                    help="run the conformance battery against a backend of this type")
    group.addoption("--switchyard-options", metavar="JSON", default="{}",
                    help="the backend's options as a JSON object (its [backends.options] table)")
    group.addoption("--switchyard-model", metavar="NAME", default=None,
                    help="the model to test (default: the first the backend lists)")
    group.addoption("--switchyard-module", metavar="MODULE", action="append", default=[],
                    help="also register this module as a plugin (like [plugins] modules); repeatable")
    group.addoption("--switchyard-check", metavar="NAME", action="append", default=[],
                    help="run only this check; repeatable")


class SyncBattery:
    """A `Battery` driven from synchronous tests: one event loop for the backend's whole life,
    each verdict computed once."""

    def __init__(self, subject: Subject) -> None:
        self.battery = Battery(subject)
        self.loop = asyncio.new_event_loop()
        self.verdicts: dict[str, Verdict] = {}

    def verdict(self, name: str) -> Verdict:
        if name not in self.verdicts:
            self.verdicts[name] = self.loop.run_until_complete(self.battery.run(name))
        return self.verdicts[name]

    def assert_passes(self, name: str) -> None:
        verdict = self.verdict(name)
        if verdict.status == "skip":
            pytest.skip(f"{name}: {verdict.message}")
        if verdict.status == "fail":
            pytest.fail(format_verdict(verdict), pytrace=False)

    def shutdown(self) -> None:
        if not self.loop.is_closed():
            self.loop.run_until_complete(self.battery.shutdown())
            self.loop.close()


def _selected(config: pytest.Config) -> list[str]:
    try:
        return [check.name for check in ordered(config.getoption("--switchyard-check") or None)]
    except ConfigError as exc:
        raise pytest.UsageError(f"--switchyard-check: {exc.message}") from None


def subject_from_options(config: pytest.Config) -> Subject | None:
    type_name = config.getoption("--switchyard-backend")
    if not type_name:
        return None
    try:
        options = json.loads(config.getoption("--switchyard-options"))
    except ValueError as exc:
        raise pytest.UsageError(f"--switchyard-options is not JSON: {exc}") from None
    try:
        return Subject.of_type(type_name, options, model=config.getoption("--switchyard-model"),
                               modules=config.getoption("--switchyard-module"))
    except ConfigError as exc:
        raise pytest.UsageError(f"--switchyard-backend / --switchyard-options: {exc.message}") from None


# -- the command-line form: one item per check ---------------------------------------------------


class CheckItem(pytest.Item):
    def __init__(self, *, check: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.check = check

    def runtest(self) -> None:
        self.config.stash[BATTERY_KEY].assert_passes(self.check)

    def reportinfo(self) -> tuple[str, None, str]:
        return "switchyard", None, f"switchyard conformance check {self.check}"


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    subject = subject_from_options(config)
    if subject is None:
        return
    battery = config.stash[BATTERY_KEY] = SyncBattery(subject)
    config.add_cleanup(battery.shutdown)
    items.extend(CheckItem.from_parent(session, name=name, nodeid=f"switchyard::{name}", check=name)
                 for name in _selected(config))


# -- the fixture form ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def switchyard_subject(request: pytest.FixtureRequest) -> Subject:
    """The backend under test: from --switchyard-backend / --switchyard-options, or override this
    fixture (module scope) to return a `switchyard.testing.Subject`."""
    subject = subject_from_options(request.config)
    if subject is None:
        pytest.skip("no backend under test: pass --switchyard-backend=TYPE or override the switchyard_subject fixture")
    return subject


@pytest.fixture(scope="module")
def switchyard_battery(switchyard_subject: Subject):  # noqa: ANN201 - a generator fixture
    """The battery against `switchyard_subject`, started once per module, closed after it."""
    battery = SyncBattery(switchyard_subject)
    yield battery
    battery.shutdown()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "switchyard_check" in metafunc.fixturenames:
        names = _selected(metafunc.config)
        metafunc.parametrize("switchyard_check", names, ids=names)
