"""The field inventory read from the pinned official SDKs (tests/support/sdk_fields.py) is complete
and consistent, and knows every top-level field the real agent CLIs send, but the one Codex
adds of its own."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

from tests.support import agent_recordings, sdk_fields

INVENTORY = {entry.api: entry for entry in sdk_fields.inventory()}
# what the SDK methods take beside the body: headers (`betas` -> anthropic-beta,
# `user_profile_id`, `workspace_id`) and a Python-only helper (`output_format`, a pydantic type
# turned into `output_config.format`)
NOT_BODY = {"betas", "user_profile_id", "workspace_id"}
METHOD_ONLY = {"output_format"}
# top-level fields a CLI sends that its API's SDK does not have
CLI_ONLY = {"claude": set(), "codex": {"client_metadata"}}


def _pinned(dist: str) -> str:
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    return re.search(rf'"{dist}==([^"]+)"', pyproject).group(1)


def test_the_installed_sdks_are_the_pinned_ones() -> None:
    for dist in ("openai", "anthropic"):
        assert importlib.metadata.version(dist) == _pinned(dist)
        assert {e.sdk for e in INVENTORY.values() if e.sdk.startswith(dist)} == {f"{dist} {_pinned(dist)}"}


def test_every_api_is_read() -> None:
    assert set(INVENTORY) == set(sdk_fields.GATEWAY_STRUCTS) == {r.api for r in sdk_fields.SDK_REQUESTS}
    for entry in INVENTORY.values():
        assert len(entry.body) >= 5, entry.api


@pytest.mark.parametrize("api", sorted(INVENTORY))
def test_body_fields_are_typeddict_fields(api: str) -> None:
    entry = INVENTORY[api]
    assert entry.body <= set(entry.fields)
    assert entry.elsewhere <= NOT_BODY, entry.elsewhere - NOT_BODY
    assert entry.method_only <= METHOD_ONLY, entry.method_only - METHOD_ONLY


def test_required_fields() -> None:
    required = {api: {name for name, req in entry.fields.items() if req} for api, entry in INVENTORY.items()}
    assert required["openai.chat.completions"] == {"messages", "model"}
    assert required["openai.completions"] == {"model", "prompt"}
    assert required["openai.embeddings"] == {"input", "model"}
    assert required["openai.responses"] == set()  # a stored prompt may give the model and input
    for api in ("anthropic.messages", "anthropic.beta.messages"):
        assert required[api] == {"max_tokens", "messages", "model"}
    for api in ("anthropic.messages.count_tokens", "anthropic.beta.messages.count_tokens"):
        assert required[api] == {"messages", "model"}


def test_typeddict_fields_reads_required_through_lazy_annotations() -> None:
    from openai.types.chat import completion_create_params as params

    base = sdk_fields.typeddict_fields(params.CompletionCreateParamsBase)
    streaming = sdk_fields.typeddict_fields(params.CompletionCreateParamsStreaming)
    assert params.CompletionCreateParamsBase.__required_keys__ == frozenset()  # why get_type_hints is needed
    assert base["messages"] and base["model"] and not base["temperature"] and "stream" not in base
    assert streaming["stream"] and streaming["messages"] and not streaming["temperature"]


@pytest.mark.parametrize(("cli", "api"), [("claude", "anthropic.beta.messages"), ("codex", "openai.responses")])
def test_the_sdk_knows_what_the_agent_cli_sends(cli: str, api: str) -> None:
    sent = set().union(*(set(r.body) for r in agent_recordings.api_requests(cli)))
    assert sent - INVENTORY[api].body == CLI_ONLY[cli]
