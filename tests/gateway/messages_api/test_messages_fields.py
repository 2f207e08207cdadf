"""Every request field the pinned `anthropic` SDK sends, on the standard and the beta API (Claude
Code's), is one the Messages front-end has classified: decoded by its struct, and acted on,
ignored with a reason or refused with a reason (`gateway/messages_api/fields.py`). A newer SDK's
field fails here until it is given one of the three."""

from __future__ import annotations

import pytest

from gateway.messages_api.fields import COUNT_TOKENS_FIELDS, MESSAGES_FIELDS
from tests.support import sdk_fields

INVENTORY = {entry.api: entry for entry in sdk_fields.inventory()}
TABLES = {"anthropic.messages": MESSAGES_FIELDS, "anthropic.beta.messages": MESSAGES_FIELDS,
          "anthropic.messages.count_tokens": COUNT_TOKENS_FIELDS,
          "anthropic.beta.messages.count_tokens": COUNT_TOKENS_FIELDS}
# fields the gateway takes beyond the pinned SDK's (Anthropic's API takes them; older SDKs send them)
BEYOND_THE_SDK = {"temperature", "top_p", "top_k"}


@pytest.mark.parametrize("api", sorted(TABLES))
def test_every_sdk_field_is_classified(api: str) -> None:
    table = TABLES[api]
    taken = sdk_fields.struct_fields(table.struct)
    assert INVENTORY[api].body - taken == set(), f"{api}: fields the SDK sends that the gateway does not classify"
    assert taken - INVENTORY["anthropic.beta." + api.removeprefix("anthropic.").removeprefix("beta.")].body <= BEYOND_THE_SDK


@pytest.mark.parametrize("table", [MESSAGES_FIELDS, COUNT_TOKENS_FIELDS], ids=lambda t: t.api)
def test_every_ignored_or_refused_field_says_why(table) -> None:  # noqa: ANN001
    for name, why in {**table.ignored, **table.refused}.items():
        assert len(why) > 20, name
    assert {"context_management", "cache_control"} <= set(table.ignored)
    assert "mcp_servers" in table.refused
    assert {"messages", "model", "system", "tools", "thinking", "output_config"} <= table.acted_on
