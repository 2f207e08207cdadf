"""Agents' model names reach a route without renaming (aliases and globs: an exact name first,
then globs in declared order), and `/v1/models` lists the routes — not the globs — in the shape
of the client that asks: OpenAI's, Anthropic's (`anthropic-version`; the official client pages
through it) or Codex's catalog (`client_version`), with each route's context window. Through the
official clients against a running gateway."""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from gateway.config import parse_config
from gateway.service.model_names import ModelNames
from gateway.service.route_plan import validate_names
from plugins.contract.errors import ConfigError
from tests.gateway.conftest import backend_table
from tests.support.gateway_thread import GatewayThread
from tests.support.server import echo_config

ROUTES = """
[[routes]]
name = "smollm"
aliases = ["claude-*", "gpt-*-codex", "my-exact"]
[[routes.targets]]
backend = "echo"
model = "a-1"

[[routes]]
name = "other"
aliases = ["gpt-*", "claude-opus-*"]
[[routes.targets]]
backend = "b"
model = "b-1"

[[routes]]
name = "haiku-*"
[[routes.targets]]
backend = "b"
model = "b-1"
"""
KEYS = """
[server]
health_interval_s = 0
[[server.keys]]
key = "sk-all"
[[server.keys]]
name = "limited"
key = "sk-limited"
routes = ["smollm"]

"""
CONFIG = (KEYS + echo_config(models=["a-1"], answer_prefix="fromA") + "\n"
          + backend_table("b", models=["b-1", "claude-exact"], answer_prefix="fromB", max_model_len=128) + ROUTES)


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayThread]:
    with GatewayThread(CONFIG) as g:
        yield g


@pytest.fixture(scope="module")
def oa(gw: GatewayThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gw.base + "/v1", api_key="sk-all", max_retries=0, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def claude(gw: GatewayThread) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gw.base, api_key="sk-all", max_retries=0, timeout=30) as client:
        yield client


def served_by(oa: openai.OpenAI, model: str) -> tuple[str, str]:
    """(the backend that answered, the model the answer names)"""
    raw = oa.chat.completions.with_raw_response.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                       max_tokens=4)
    return raw.headers["x-switchyard-backend"], raw.parse().model


@pytest.mark.parametrize(("model", "backend"), [
    ("smollm", "echo"),  # the route's own name
    ("my-exact", "echo"),  # an exact alias
    ("claude-sonnet-5", "echo"),  # a glob alias
    ("claude-opus-5-5", "echo"),  # two routes' globs match: the one declared first
    ("gpt-6.2-codex", "echo"),  # gpt-*-codex is declared before gpt-*
    ("gpt-6.2-sol", "b"),
    ("haiku-4", "b"),  # a route named by a glob
    ("claude-exact", "b"),  # a model served under its own name: exact wins over any glob
    ("b-1", "b"),
])
def test_a_name_reaches_its_route(oa: openai.OpenAI, model: str, backend: str) -> None:
    assert served_by(oa, model) == (backend, model)  # the answer names the model the client asked for


def test_a_name_nothing_matches_is_model_not_found(oa: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        served_by(oa, "llama-3")
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        served_by(oa, "Claude-sonnet-5")  # globs are case-sensitive


def test_messages_through_an_alias(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(model="claude-sonnet-5", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert message.model == "claude-sonnet-5" and message.content[0].text.startswith("fromA")


def test_a_key_may_use_a_route_by_any_of_its_names(gw: GatewayThread) -> None:
    with openai.OpenAI(base_url=gw.base + "/v1", api_key="sk-limited", max_retries=0, timeout=30) as limited:
        assert served_by(limited, "claude-sonnet-5")[0] == "echo"
        with pytest.raises(openai.PermissionDeniedError):
            served_by(limited, "gpt-6.2-sol")
        assert [m.id for m in limited.models.list()] == ["smollm"]


def test_openai_list_shows_the_routes_not_the_globs(oa: openai.OpenAI) -> None:
    models = {m.id: m for m in oa.models.list()}
    assert set(models) == {"smollm", "other", "a-1", "b-1", "claude-exact"}
    assert models["other"].model_extra["max_model_len"] == 128 and models["smollm"].model_extra["max_model_len"] == 256
    assert oa.models.retrieve("claude-sonnet-5").id == "claude-sonnet-5"  # an alias describes its route


def test_anthropic_clients_get_anthropics_list(claude: anthropic.Anthropic, oa: openai.OpenAI) -> None:
    models = list(claude.models.list(limit=2))  # the client pages through has_more / last_id
    assert [m.id for m in models] == [m.id for m in oa.models.list()]
    assert all(m.type == "model" and m.display_name == m.id for m in models)
    assert all(m.created_at.tzinfo is not None and m.created_at <= datetime.datetime.now(datetime.UTC) for m in models)
    card = claude.models.retrieve("claude-opus-5-5")
    assert card.id == "claude-opus-5-5" and card.type == "model"
    with pytest.raises(anthropic.NotFoundError):
        claude.models.retrieve("llama-3")


def test_anthropic_paging(gw: GatewayThread) -> None:
    headers = {"anthropic-version": "2023-06-01", "x-api-key": "sk-all", "authorization": "Bearer sk-all"}
    everything = httpx.get(gw.base + "/v1/models", headers=headers, params={"limit": 1000}).json()
    ids = [m["id"] for m in everything["data"]]
    assert everything["has_more"] is False and (everything["first_id"], everything["last_id"]) == (ids[0], ids[-1])
    page = httpx.get(gw.base + "/v1/models", headers=headers, params={"limit": 2, "after_id": ids[0]}).json()
    assert [m["id"] for m in page["data"]] == ids[1:3] and page["has_more"] is True
    page = httpx.get(gw.base + "/v1/models", headers=headers, params={"limit": 2, "before_id": ids[-1]}).json()
    assert [m["id"] for m in page["data"]] == ids[-3:-1] and page["has_more"] is True
    bad = httpx.get(gw.base + "/v1/models", headers=headers, params={"limit": 0})
    assert bad.status_code == 400


def test_codex_gets_its_catalog_with_the_context_windows(gw: GatewayThread) -> None:
    resp = httpx.get(gw.base + "/v1/models", params={"client_version": "0.171.0"}, headers={"authorization": "Bearer sk-all"})
    assert resp.status_code == 200
    models = {m["slug"]: m for m in resp.json()["models"]}
    assert set(models) == {"smollm", "other", "a-1", "b-1", "claude-exact"}
    assert models["other"]["context_window"] == 128 and models["smollm"]["context_window"] == 256
    assert models["smollm"]["display_name"] == "smollm" and models["smollm"]["supported_in_api"] is True


# -- the rules and their validation ------------------------------------------------------------------


def test_exact_aliases_before_globs_and_globs_in_order() -> None:
    config = parse_config(CONFIG, "<test>")
    names = ModelNames(config.routes)
    routes = {"smollm", "other", "haiku-*", "echo-1"}
    assert names.route_of("echo-1", routes) == "echo-1"
    assert names.route_of("my-exact", routes) == "smollm"
    assert names.route_of("claude-opus-1", routes) == "smollm"
    assert names.route_of("gpt-4o", routes) == "other"
    assert names.route_of("haiku-x", routes) == "haiku-*"
    assert names.route_of("nothing", routes) is None


@pytest.mark.parametrize(("routes", "key"), [
    ('[[routes]]\nname = "a"\n[[routes.targets]]\nbackend = "echo"\n'
     '[[routes]]\nname = "b"\naliases = ["a"]\n[[routes.targets]]\nbackend = "echo"\n', "routes[1].aliases[0]"),
    ('[[routes]]\nname = "a"\naliases = ["x"]\n[[routes.targets]]\nbackend = "echo"\n'
     '[[routes]]\nname = "b"\naliases = ["x"]\n[[routes.targets]]\nbackend = "echo"\n', "routes[1].aliases[0]"),
    ('[[routes]]\nname = "claude-*"\n[[routes.targets]]\nbackend = "echo"\n', "routes[0].targets[0].model"),
])
def test_ambiguous_names_stop_start_up_naming_the_key(routes: str, key: str) -> None:
    config = parse_config(echo_config() + "\n" + routes, "<test>")
    with pytest.raises(ConfigError) as info:
        validate_names(config)
    assert info.value.param == key and f"`{key}`" in info.value.message


def test_an_empty_alias_stops_start_up() -> None:
    with pytest.raises(ConfigError, match=r"routes\[0\]\.aliases\[0\]"):
        parse_config(echo_config() + '\n[[routes]]\nname = "a"\naliases = [""]\n[[routes.targets]]\nbackend = "echo"\n', "<t>")
