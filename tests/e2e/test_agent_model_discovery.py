"""The real Codex CLI (pinned, `engines/agents.py`) reads the model catalog the gateway gives it
(`GET /v1/models?client_version=...`, gateway/model_cards.py): fetched itself where its provider
authenticates by command, or saved as its `model_catalog_json` — either way Codex knows the
served model and its context window instead of warning that it has no metadata and assuming
272,000 tokens. What Codex does with its turn afterwards is the Responses front-end's business:
only the discovery is checked here."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from engines import agents
from tests.support.server import echo_config, running_server

MODEL = "served-model"
CONTEXT = 8192
NO_METADATA = f"Model metadata for `{MODEL}` not found"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(echo_config(models=[MODEL], max_model_len=CONTEXT), tmp_path_factory.mktemp("discovery")) as url:
        yield url


def run_codex(base: str, home: Path, edit: Callable[[str], str]) -> tuple[subprocess.CompletedProcess[str], Path]:
    command = agents.codex_command("Say hi", base_url=base + "/v1", home=home, model=MODEL, fewest_tools=True)
    config = home / ".codex" / "config.toml"
    config.write_text(edit(config.read_text()))
    done = subprocess.run(command.argv, env=command.env, cwd=home, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    return done, home / ".codex"


def test_without_discovery_codex_has_no_metadata(base: str, tmp_path: Path) -> None:
    """The baseline the two others improve on: an API-key provider fetches no catalog."""
    done, _ = run_codex(base, tmp_path, lambda text: text)
    assert NO_METADATA in done.stdout, done.stdout + done.stderr


def test_codex_fetches_the_catalog_itself(base: str, tmp_path: Path) -> None:
    # a provider whose key comes from a command: Codex then refreshes its catalog from the provider
    def command_auth(text: str) -> str:
        return text.replace(f'env_key = "{agents.CODEX_KEY_ENV}"\n', "") + (
            f'\n[model_providers.{agents.CODEX_PROVIDER}.auth]\ncommand = "echo"\nargs = ["{agents.API_KEY}"]\n')

    done, codex_home = run_codex(base, tmp_path, command_auth)
    assert NO_METADATA not in done.stdout, done.stdout + done.stderr
    assert "failed to decode models response" not in done.stderr, done.stderr
    cache = json.loads((codex_home / "models_cache.json").read_text())
    (model,) = [m for m in cache["models"] if m["slug"] == MODEL]
    assert model["context_window"] == CONTEXT and model["max_context_window"] == CONTEXT


def test_a_saved_catalog_serves_as_model_catalog_json(base: str, tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.json"
    catalog.write_bytes(httpx.get(base + "/v1/models", params={"client_version": agents.version(agents.install.CODEX)}).content)
    done, _ = run_codex(base, tmp_path, lambda text: f'model_catalog_json = "{catalog}"\n' + text)
    assert "model_catalog_json" not in done.stderr, done.stderr  # Codex refuses a catalog it cannot read at start
    assert NO_METADATA not in done.stdout, done.stdout + done.stderr
