"""Every wire API's field table (`gateway.http.fields`, `gateway/<api>/fields.py`) against the pinned
official SDKs and a running gateway:

- every body field the pinned `openai` / `anthropic` SDK sends for an API is a field of the
  gateway's request struct for it, so acted on, ignored or refused (a newer SDK's field fails here
  until its table decides; a field no SDK lists stays a 400 naming it);
- a table names only fields of its struct, each with a reason;
- on a running gateway, through the official clients: an ignored field is served and counted in
  `switchyard_ignored_fields_total{api,field}`, a refused one is a 400 naming it with its reason,
  a typo a 400 naming it;
- the README's lists are the tables' (`switchyard fields --readme README.md` regenerates them).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from msgspec import inspect as mi
from prometheus_client.parser import text_string_to_metric_families

from gateway.chat_api.fields import CHAT_FIELDS, COMPLETIONS_FIELDS
from gateway.cli import fields as cli_fields
from gateway.embeddings_api.fields import EMBEDDINGS_FIELDS
from gateway.http.fields import FieldTable
from gateway.messages_api.fields import COUNT_TOKENS_FIELDS, MESSAGES_FIELDS
from gateway.responses_api.fields import RESPONSES_FIELDS
from tests.support import sdk_fields
from tests.support.server import ROOT

INVENTORY = {entry.api: entry for entry in sdk_fields.inventory()}
# the table that decides each SDK API's fields (the beta Messages endpoints decode into the same structs)
TABLE_OF: dict[str, FieldTable] = {
    "openai.chat.completions": CHAT_FIELDS,
    "openai.completions": COMPLETIONS_FIELDS,
    "openai.responses": RESPONSES_FIELDS,
    "openai.embeddings": EMBEDDINGS_FIELDS,
    "anthropic.messages": MESSAGES_FIELDS,
    "anthropic.beta.messages": MESSAGES_FIELDS,
    "anthropic.messages.count_tokens": COUNT_TOKENS_FIELDS,
    "anthropic.beta.messages.count_tokens": COUNT_TOKENS_FIELDS,
}
TABLES = list(cli_fields.TABLES.values())
def test_every_sdk_api_has_a_table() -> None:
    assert set(TABLE_OF) == set(INVENTORY) == set(sdk_fields.GATEWAY_STRUCTS)
    assert all(any(table is t for t in TABLES) for table in TABLE_OF.values())


@pytest.mark.parametrize("api", sorted(INVENTORY))
def test_the_table_is_over_the_struct_that_decodes_the_api(api: str) -> None:
    dotted = sdk_fields.GATEWAY_STRUCTS[api]
    assert dotted is not None
    module, _, name = dotted.rpartition(".")
    assert TABLE_OF[api].struct is getattr(__import__(module, fromlist=[name]), name)


@pytest.mark.parametrize("api", sorted(INVENTORY))
def test_every_field_the_sdk_sends_is_classified(api: str) -> None:
    """A field the SDK posts and the struct lacks would be a 400 for a field the real API takes."""
    unclassified = INVENTORY[api].body - sdk_fields.struct_fields(TABLE_OF[api].struct)
    assert unclassified == set(), f"{api}: decide in {TABLE_OF[api].api}'s table what these become: {sorted(unclassified)}"


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.api)
def test_a_table_names_only_its_struct_fields_with_a_reason(table: FieldTable) -> None:
    fields = set(table.struct.__struct_fields__)
    assert table.acted_on | set(table.ignored) | set(table.refused) == fields
    assert not set(table.ignored) & set(table.refused)
    assert all(reason.strip() for reason in (*table.ignored.values(), *table.refused.values()))
    with pytest.raises(TypeError, match="not_a_field"):
        FieldTable(api=table.api, struct=table.struct, ignored={"not_a_field": "why"})


# -- on a running gateway (tests/gateway/conftest.py: the echo backend, model `echo-1`) ------------


def sample(t: mi.Type) -> Any:
    """The smallest value of type `t` that decodes: what a request carrying the field sends."""
    if isinstance(t, mi.UnionType):
        return sample(next(x for x in t.types if not isinstance(x, mi.NoneType)))
    if isinstance(t, mi.BoolType):
        return True
    if isinstance(t, (mi.IntType, mi.FloatType)):
        return t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else 1)
    if isinstance(t, mi.StrType):
        return "x" * max(1, t.min_length or 1)
    if isinstance(t, mi.LiteralType):
        return t.values[0]
    if isinstance(t, mi.ListType):
        return [sample(t.item_type)] * max(1, t.min_length or 1)
    if isinstance(t, mi.DictType):
        return {}
    if isinstance(t, mi.StructType):
        value = {f.encode_name: sample(f.type) for f in t.fields if f.required}
        if t.tag_field is not None:
            value[t.tag_field] = t.tag
        return value
    if isinstance(t, mi.AnyType):
        return "x"
    raise AssertionError(f"no sample for {t}")


def field_sample(table: FieldTable, name: str) -> Any:
    info = mi.type_info(table.struct)
    assert isinstance(info, mi.StructType)
    return sample(next(f.type for f in info.fields if f.name == name))


USER = [{"role": "user", "content": "hi there"}]
Send = Callable[[dict[str, Any]], Any]


@pytest.fixture(scope="module")
def send(server: Any) -> Iterator[dict[str, Send]]:
    """Per table: one request of that API with `extra_body` merged in, sent by the official client."""
    with openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0, timeout=30) as oa, \
            anthropic.Anthropic(base_url=server.base, api_key="x", max_retries=0, timeout=30) as an:
        yield {
            "chat": lambda extra: oa.chat.completions.create(model="echo-1", messages=USER, max_tokens=2, extra_body=extra),
            "completions": lambda extra: oa.completions.create(model="echo-1", prompt="hi there", max_tokens=2,
                                                               extra_body=extra),
            "responses": lambda extra: oa.responses.create(model="echo-1", input="hi there", max_output_tokens=16,
                                                           store=False, extra_body=extra),
            "embeddings": lambda extra: oa.embeddings.create(model="echo-1", input="hi", extra_body=extra),
            "messages": lambda extra: an.messages.create(model="echo-1", max_tokens=2, messages=USER, extra_body=extra),
            "count_tokens": lambda extra: an.messages.count_tokens(model="echo-1", messages=USER, extra_body=extra),
        }


def ignored_count(server: Any, api: str, field: str) -> float:
    text = httpx.get(server.base + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "switchyard_ignored_fields_total" and s.labels == {"api": api, "field": field}:
                return s.value
    return 0.0


IGNORED = [(t, name) for t in TABLES for name in sorted(t.ignored)]
REFUSED = [(t, name) for t in TABLES for name in sorted(t.refused)]


def _ids(cases: list[tuple[FieldTable, str]]) -> list[str]:
    return [f"{t.api}-{name}" for t, name in cases]


@pytest.mark.parametrize(("table", "name"), IGNORED, ids=_ids(IGNORED))
def test_an_ignored_field_is_served_and_counted(server: Any, send: dict[str, Send], table: FieldTable, name: str) -> None:
    before = ignored_count(server, table.api, name)
    send[table.api]({name: field_sample(table, name)})  # a 4xx would raise
    assert ignored_count(server, table.api, name) == before + 1


def _error_of(exc: Exception) -> tuple[int, str, str | None]:
    assert isinstance(exc, (openai.APIStatusError, anthropic.APIStatusError)), exc
    error = exc.body.get("error", exc.body) if isinstance(exc.body, dict) else {}
    return exc.status_code, error.get("message", ""), error.get("param")


@pytest.mark.parametrize(("table", "name"), REFUSED, ids=_ids(REFUSED))
def test_a_refused_field_is_a_400_naming_it_and_why(server: Any, send: dict[str, Send], table: FieldTable,
                                                    name: str) -> None:
    with pytest.raises(Exception) as caught:
        send[table.api]({name: field_sample(table, name)})
    status, message, param = _error_of(caught.value)
    assert status == 400
    assert f"`{name}`" in message and table.refused[name] in message
    assert param in (name, None)  # Anthropic's error object has no `param`
    if isinstance(caught.value, openai.APIStatusError):
        assert param == name


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.api)
def test_a_typo_is_a_400_naming_it(server: Any, send: dict[str, Send], table: FieldTable) -> None:
    with pytest.raises(Exception) as caught:
        send[table.api]({"temprature": 0.5})
    status, message, _ = _error_of(caught.value)
    assert status == 400 and "temprature" in message


# -- the README ---------------------------------------------------------------------------------


def test_the_readme_lists_what_the_tables_say() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = cli_fields.readme_blocks(readme)
    assert set(blocks) == set(cli_fields.TABLES), "every API's table has a `<!-- fields:<api> -->` block in the README"
    stale = [api for api, table in cli_fields.TABLES.items() if blocks[api] != cli_fields.block(table)]
    assert stale == [], f"README out of date for {stale}: run `switchyard fields --readme README.md`"
    assert cli_fields.rewrite_readme(readme) == readme


def test_the_command_prints_every_table() -> None:
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "fields"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    for api, table in cli_fields.TABLES.items():
        assert f"## {api}\n{cli_fields.markdown(table)}\n" in done.stdout
    assert "`moderation`: " + CHAT_FIELDS.refused["moderation"] in done.stdout


def test_a_table_change_shows_in_the_readme_only_once_regenerated() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = FieldTable(api="chat", struct=CHAT_FIELDS.struct, ignored={**CHAT_FIELDS.ignored, "user": "a test reason"},
                       refused=CHAT_FIELDS.refused)
    assert cli_fields.block(table) != cli_fields.readme_blocks(readme)["chat"]
