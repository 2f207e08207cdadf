"""The beta parts of a Messages request (those Claude Code sends) in the RequestSpec: system turns
inside `messages`, the thinking switch from `thinking` and effort, `output_config.format`,
deferred tools and mid-conversation tool changes, the session in `metadata.user_id`."""

from __future__ import annotations

import json

import msgspec
import pytest

from gateway.messages_api import schemas as M
from gateway.messages_api.translate import count_tokens_request, messages_spec, omits_thinking
from plugins.contract.errors import InvalidRequest

ASK = {"role": "user", "content": "hi"}


def decode(**body):  # noqa: ANN003, ANN201
    body = {"model": "m", "max_tokens": 100, "messages": [ASK], **body}
    return msgspec.json.decode(msgspec.json.encode(body), type=M.MessagesRequest)


def spec_of(**body):  # noqa: ANN003, ANN201
    return messages_spec(decode(**body), request_id="r")


def tool(name: str, **extra) -> dict:  # noqa: ANN003
    return {"name": name, "input_schema": {"type": "object"}, **extra}


def names(spec) -> list[str] | None:  # noqa: ANN001
    return None if spec.tools is None else [t["function"]["name"] for t in spec.tools]


def test_system_turns_stay_in_place_and_a_first_request_may_end_with_one() -> None:
    spec = spec_of(system="top", messages=[ASK, {"role": "system", "content": [{"type": "text", "text": "env"},
                                                                             {"type": "text", "text": "date"}]}])
    assert spec.messages == [{"role": "system", "content": "top"}, {"role": "user", "content": "hi"},
                             {"role": "system", "content": "env\ndate"}]
    assert spec.add_generation_prompt and not spec.continue_final_message
    later = spec_of(messages=[ASK, {"role": "system", "content": "env"}, {"role": "assistant", "content": "yo"},
                              {"role": "user", "content": "more"}])
    assert [m["role"] for m in later.messages] == ["user", "system", "assistant", "user"]


def test_a_system_turn_cleared_at_the_next_user_turn() -> None:
    cleared = {"role": "system", "content": "only now", "clear_at": "next_user_message"}
    assert spec_of(messages=[ASK, cleared]).messages[-1] == {"role": "system", "content": "only now"}
    later = spec_of(messages=[ASK, cleared, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}])
    assert "only now" not in json.dumps(later.messages)
    kept = spec_of(messages=[ASK, {**cleared, "clear_at": "never"}, {"role": "assistant", "content": "a"},
                             {"role": "user", "content": "b"}])
    assert kept.messages[1] == {"role": "system", "content": "only now"}


def test_a_system_turn_needs_content_or_output_config() -> None:
    with pytest.raises(InvalidRequest) as info:
        spec_of(messages=[ASK, {"role": "system", "content": ""}])
    assert info.value.param == "messages[1].content"
    only_effort = spec_of(messages=[ASK, {"role": "system", "output_config": {"effort": "low"}}],
                          thinking={"type": "adaptive"})
    assert only_effort.messages == [{"role": "user", "content": "hi"}]
    assert only_effort.chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize(("thinking", "effort", "switch", "demanded"), [
    ({"type": "enabled", "budget_tokens": 1024}, None, True, True),
    ({"type": "between_tools"}, None, True, True),
    ({"type": "disabled"}, "max", False, True),
    ({"type": "adaptive", "display": "updates"}, None, True, False),
    ({"type": "adaptive"}, "low", False, False),
    ({"type": "adaptive"}, "medium", True, False),
    ({"type": "adaptive"}, "xhigh", True, False),
    (None, "low", None, False),
    (None, None, None, False),
])
def test_thinking_and_effort_switch_the_template(thinking: dict | None, effort: str | None, switch: bool | None,
                                                 demanded: bool) -> None:
    body = {"max_tokens": 2000}
    if thinking is not None:
        body["thinking"] = thinking
    if effort is not None:
        body["output_config"] = {"effort": effort}
    spec = spec_of(**body)
    assert spec.chat_template_kwargs == (None if switch is None else {"enable_thinking": switch})
    assert ("chat_template_kwargs" in spec.extensions) is demanded


def test_a_system_turns_effort_overrides_the_requests() -> None:
    turn = {"role": "system", "content": "env", "output_config": {"effort": "low"}}
    spec = spec_of(messages=[ASK, turn], thinking={"type": "adaptive"}, output_config={"effort": "high"})
    assert spec.chat_template_kwargs == {"enable_thinking": False}


def test_display_omitted() -> None:
    assert omits_thinking(decode(thinking={"type": "adaptive", "display": "omitted"}))
    assert not omits_thinking(decode(thinking={"type": "adaptive", "display": "summarized"}))
    assert not omits_thinking(decode())


def test_output_format_is_a_json_schema_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    spec = spec_of(output_config={"format": {"type": "json_schema", "schema": schema}, "task_budget": {
        "type": "tokens", "total": 50000}})
    assert spec.response_format == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}
    assert spec_of(output_config={"effort": "high"}).response_format is None


def test_an_empty_tool_list_is_no_tools() -> None:
    """Claude Code with `--tools ""` sends `tools: []`."""
    spec = spec_of(tools=[])
    assert spec.tools is None and spec.tool_choice is None


def test_deferred_tools_wait_for_the_tool_search() -> None:
    tools = [tool("Read"), tool("Search"), tool("Late", defer_loading=True), tool("Never", defer_loading=True)]
    assert names(spec_of(tools=tools)) == ["Read", "Search"]
    found = spec_of(tools=tools, messages=[
        ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Search", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "tool_reference", "tool_name": "Late"}]}]}])
    assert names(found) == ["Read", "Search", "Late"]
    assert found.messages[-1] == {"role": "tool", "tool_call_id": "t1", "content": "Tool `Late` is now available."}
    forced = spec_of(tools=tools, tool_choice={"type": "tool", "name": "Never"})
    assert names(forced) == ["Read", "Search", "Never"]


def test_tools_added_and_withdrawn_mid_conversation() -> None:
    tools = [tool("Read"), tool("Late", defer_loading=True)]
    changes = {"role": "system", "content": [
        {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "Late"}},
        {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "Read"}},
        {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": tool("Inline", description="d")}},
    ]}
    spec = spec_of(tools=tools, messages=[ASK, changes])
    assert names(spec) == ["Late", "Inline"]
    assert spec.messages == [{"role": "user", "content": "hi"}]  # a turn of tool changes alone shows nothing
    for bad, param in [
        ({"type": "tool_addition", "tool": {"type": "tool_reference", "name": "nope"}}, "messages[1].content[0].tool.name"),
        ({"type": "tool_removal", "tool": {"type": "tool_reference", "name": "nope"}}, "messages[1].content[0].tool.name"),
        ({"type": "tool_addition", "tool": {"type": "mcp_tool_reference", "name": "x", "server_name": "s"}},
         "messages[1].content[0].tool"),
    ]:
        with pytest.raises(InvalidRequest) as info:
            spec_of(tools=tools, messages=[ASK, {"role": "user", "content": [bad, {"type": "text", "text": "go"}]}])
        assert info.value.param == param


def test_session_from_claude_codes_user_id() -> None:
    user_id = json.dumps({"device_id": "d", "account_uuid": "", "session_id": "s-1"})
    spec = spec_of(metadata={"user_id": user_id})
    assert spec.session == "s-1" and spec.user == user_id
    for other in ("alice", "{not json", '{"session_id": 5}', '{"session_id": ""}', "[1]"):
        assert spec_of(metadata={"user_id": other}).session is None, other
    assert spec_of().session is None


def test_count_tokens_renders_as_create_does() -> None:
    body = {"model": "m", "messages": [ASK, {"role": "system", "content": "env"}], "system": "top",
            "thinking": {"type": "adaptive"}, "output_config": {"effort": "low"},
            "tools": [tool("Read"), tool("Late", defer_loading=True)], "context_management": {"edits": []}}
    counted = count_tokens_request(msgspec.convert(body, M.CountTokensRequest), upstream_model="up")
    spec = spec_of(**{k: v for k, v in body.items() if k != "model"})
    assert counted.messages == spec.messages and counted.tools == spec.tools
    assert counted.chat_template_kwargs == spec.chat_template_kwargs == {"enable_thinking": False}
