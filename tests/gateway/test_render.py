"""The template inspector: POST /switchyard/render and `switchyard render`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.app import first_difference
from gateway.cli.main import main
from tests.gateway.conftest import backend_table
from tests.support.server import echo_config, running_server

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]


def two_arm_config(prefix_b: str) -> str:
    return (
        echo_config(models=["m"])
        + "\n"
        + backend_table("other", models=["m"], answer_prefix=prefix_b)
        + '\n[[routes]]\nname = "ab"\n[[routes.targets]]\nbackend = "echo"\nmodel = "m"\n'
        + '[[routes.targets]]\nbackend = "other"\nmodel = "m"\n'
    )


@pytest.fixture(scope="module")
def differing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(two_arm_config("X"), tmp_path_factory.mktemp("render")) as base:
        yield base


def test_compare_marks_the_first_differing_token(differing: str) -> None:
    body = httpx.post(differing + "/switchyard/render", json={"model": "ab", "messages": MESSAGES, "compare": True}).json()
    assert [r["backend"] for r in body["renders"]] == ["echo", "other"]
    first, second = body["renders"]
    assert first["text"].split() == ["<system>", "Be", "brief.", "<user>", "Hello", "there"]
    assert second["text"].split() == ["X" + w for w in first["text"].split()]
    assert body["first_difference"] == 0


def test_single_render_uses_the_routed_backend(differing: str) -> None:
    body = httpx.post(differing + "/switchyard/render", json={"model": "ab", "messages": MESSAGES}).json()
    assert len(body["renders"]) == 1
    assert body["first_difference"] is None


def test_unknown_model_is_404(differing: str) -> None:
    response = httpx.post(differing + "/switchyard/render", json={"model": "nope", "messages": MESSAGES})
    assert response.status_code == 404
    assert response.json()["error"]["param"] == "model"


def test_cli_prints_renders_side_by_side(differing: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    messages = tmp_path / "messages.json"
    messages.write_text(json.dumps(MESSAGES))
    assert main(["render", "--model", "ab", "--messages", str(messages), "--compare", "--url", differing]) == 0
    out = capsys.readouterr().out
    assert "== echo (m): 6 tokens" in out and "== other (m): 6 tokens" in out
    assert ">>>" in out and "first difference at token 0" in out


@pytest.mark.parametrize(
    ("lists", "expected"),
    [([[1, 2, 3], [1, 2, 3]], None), ([[1, 2, 3], [1, 9, 3]], 1), ([[1, 2], [1, 2, 3]], 2), ([[1]], None)],
)
def test_first_difference(lists: list[list[int]], expected: int | None) -> None:
    assert first_difference(lists) == expected
