"""A Messages request's translation into the backend-neutral RequestSpec (no server)."""

from __future__ import annotations

import msgspec
import pytest

from gateway.messages_api import schemas as M
from gateway.messages_api.translate import count_tokens_request, messages_spec
from plugins.contract.errors import InvalidRequest


def spec_of(**body):  # noqa: ANN003, ANN201
    body = {"model": "m", "max_tokens": 100, **body}
    return messages_spec(msgspec.json.decode(msgspec.json.encode(body), type=M.MessagesRequest), request_id="r")


def test_conversation_becomes_chat_messages() -> None:
    spec = spec_of(
        system=[{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        messages=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "call it", "signature": "s"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "t1", "name": "get", "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "rain"}]},
                {"type": "tool_result", "tool_use_id": "t2", "content": "boom", "is_error": True},
                {"type": "text", "text": "and tomorrow?"}]},
        ],
        tools=[{"name": "get", "input_schema": {"type": "object"}, "description": "d"}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        metadata={"user_id": "u-1"}, stop_sequences=["END"], top_k=5, temperature=0.5,
    )
    assert spec.messages == [
        {"role": "system", "content": "one\ntwo"},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "call it", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "get", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "rain"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: boom"},
        {"role": "user", "content": "and tomorrow?"},
    ]
    assert spec.tools == [{"type": "function", "function": {"name": "get", "description": "d", "parameters": {"type": "object"}}}]
    assert (spec.tool_choice, spec.parallel_tool_calls, spec.user) == ("required", False, "u-1")
    assert (spec.sampling.stop, spec.sampling.top_k, spec.sampling.temperature, spec.sampling.max_tokens) == (("END",), 5, 0.5, 100)
    assert spec.extensions == {"top_k"} and spec.add_generation_prompt and not spec.continue_final_message


def test_named_tool_none_and_thinking() -> None:
    tools = [{"name": "get", "input_schema": {"type": "object"}}]
    named = spec_of(messages=[{"role": "user", "content": "x"}], tools=tools, tool_choice={"type": "tool", "name": "get"})
    assert named.tool_choice == {"type": "function", "function": {"name": "get"}}
    assert spec_of(messages=[{"role": "user", "content": "x"}], tool_choice={"type": "none"}).tool_choice == "none"
    on = spec_of(messages=[{"role": "user", "content": "x"}], thinking={"type": "enabled", "budget_tokens": 1024},
                 max_tokens=2000)
    off = spec_of(messages=[{"role": "user", "content": "x"}], thinking={"type": "disabled"})
    assert on.chat_template_kwargs == {"enable_thinking": True} and off.chat_template_kwargs == {"enable_thinking": False}
    assert "chat_template_kwargs" in on.extensions


def test_prefill_continues_the_last_assistant_turn() -> None:
    spec = spec_of(messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer is"}])
    assert spec.continue_final_message and not spec.add_generation_prompt
    assert {"continue_final_message", "add_generation_prompt"} <= spec.extensions
    counted = count_tokens_request(msgspec.convert({"model": "m", "messages": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer is"}]}, M.CountTokensRequest),
        upstream_model="up")
    assert counted.continue_final_message and counted.messages == spec.messages and counted.upstream_model == "up"


@pytest.mark.parametrize("body, param", [
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tools": [{"name": "a", "input_schema": {}, "defer_loading": True}], "tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tools": [{"name": "a", "input_schema": {}}], "tool_choice": {"type": "tool", "name": "b"}}, "tool_choice.name"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking.budget_tokens"),
])
def test_refused(body: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        spec_of(messages=[{"role": "user", "content": "x"}], **body)
    assert info.value.param == param


@pytest.mark.parametrize("messages, param", [
    ([{"role": "user", "content": []}], "messages[0].content"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}, {"role": "user", "content": "y"}],
     "messages[1].content"),
])
def test_empty_content_refused_but_in_a_final_assistant_turn(messages: list, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        spec_of(messages=messages)
    assert info.value.param == param
    spec_of(messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": []}])
