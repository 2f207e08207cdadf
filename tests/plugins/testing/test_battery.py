"""The conformance battery against the scaffold's toy backend (correct: every check passes) and
against one defective variant of it per check (each caught by its own verdict, nothing else)."""

from __future__ import annotations

import asyncio
from types import ModuleType

import pytest

from switchyard.testing import CHECKS, Subject, Verdict, run_battery
from tests.plugins.testing.defects import CAUGHT_BY, Embeds


def toy_subject(toy_plugin: ModuleType, wrap: type | None = None) -> Subject:
    def create() -> object:
        backend = toy_plugin.ToyBackend("toy", toy_plugin.ToyOptions())
        return backend if wrap is None else wrap(backend)

    return Subject(label=f"toy{'+' + wrap.__name__ if wrap else ''}", create=create)


def verdicts(subject: Subject) -> dict[str, Verdict]:
    return {v.check: v for v in asyncio.run(run_battery(subject))}


def test_the_toy_backend_passes_every_check(toy_plugin: ModuleType) -> None:
    got = verdicts(toy_subject(toy_plugin))
    assert list(got) == [*[n for n in CHECKS if n != "close"], "close"]
    assert {name: v.status for name, v in got.items()} == dict.fromkeys(got, "pass"), got
    assert got["embeddings"].message.startswith("supports_embeddings is False")


def test_a_toy_that_also_embeds_passes_every_check(toy_plugin: ModuleType) -> None:
    got = verdicts(toy_subject(toy_plugin, Embeds))
    assert {name: v.status for name, v in got.items()} == dict.fromkeys(got, "pass"), got
    assert "16 dims each, batch-independent" in got["embeddings"].message, got["embeddings"].message


@pytest.mark.parametrize("defect", list(CAUGHT_BY), ids=lambda d: d.__name__)
def test_each_defect_is_caught_by_its_own_check(toy_plugin: ModuleType, defect: type) -> None:
    check, words = CAUGHT_BY[defect]
    got = verdicts(toy_subject(toy_plugin, defect))
    failed = {name: v for name, v in got.items() if v.status == "fail"}
    assert list(failed) == [check], {n: v.message for n, v in failed.items()}
    verdict = failed[check]
    assert words in verdict.message, verdict.message
    assert verdict.fix == CHECKS[check].fix
    assert verdict.seen or check in ("cancellation", "embeddings"), "a failure shows the events it saw"


def test_every_check_is_explained_in_the_readme() -> None:
    from tests.support.server import ROOT

    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| check | passes when | when it fails |"):]
    for name in CHECKS:
        assert f"\n| `{name}` |" in table, f"README's verdict table does not explain the check {name!r}"


def test_every_extension_has_a_sample_request() -> None:
    from plugins.contract.protocol import EXTENSIONS
    from plugins.testing.checks.capabilities import EXTENSION_SAMPLES

    assert set(EXTENSION_SAMPLES) == EXTENSIONS
