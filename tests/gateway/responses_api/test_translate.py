"""Responses input items → chat messages (gateway/responses_api/translate.py): developer messages,
custom tool calls, and earlier reasoning given back as `reasoning.context` asks."""

from __future__ import annotations

import msgspec
import pytest

from gateway.responses_api import schemas as R
from gateway.responses_api import translate
from gateway.responses_api.reasoning_seal import ReasoningSeal
from plugins.contract.errors import InvalidRequest

SEAL = ReasoningSeal(b"s" * 32)


def request(items: list[dict], **fields: object) -> R.ResponsesRequest:
    return msgspec.convert({"model": "m", "input": items, **fields}, R.ResponsesRequest)


def messages(items: list[dict], *, all_turns: bool = False, **fields: object) -> list[dict]:
    req = request(items, **fields)
    parsed = translate.input_items(req)
    turn = translate.to_messages(parsed, set(), seal=SEAL, all_turns=all_turns)
    return translate.to_spec(req, request_id="r", history=[], turn=turn,
                             tools=translate.request_tools(req, parsed, "drop")).messages


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def reasoning(text: str, *, sealed: bool = True) -> dict:
    if sealed:  # as Codex resends it: summary and the sealed text, no `content`
        return {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": SEAL.seal(text)}
    return {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def call(call_id: str, name: str = "get_weather", **more: object) -> dict:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}", **more}


def output(call_id: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": "sunny"}


def test_developer_messages_and_instructions_make_one_system_message_first() -> None:
    got = messages([{"role": "developer", "content": "Be precise."},
                    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Skills."}]},
                    user("hi"), {"role": "developer", "content": "Later note."}], instructions="You are Codex.")
    assert got == [{"role": "system", "content": "You are Codex.\n\nBe precise.\n\nSkills."}, user("hi"),
                   {"role": "system", "content": "Later note."}]


def test_current_turn_reasoning_goes_back_with_its_call() -> None:
    got = messages([user("old question"), reasoning("old thought"), {"role": "assistant", "content": "old answer"},
                    user("weather?"), reasoning("I should call the tool."), call("c1"), output("c1")])
    assert "reasoning_content" not in got[1]  # an earlier turn's, left out (reasoning.context: current_turn)
    assert got[3] == {"role": "assistant", "content": "", "reasoning_content": "I should call the tool.",
                      "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}
    assert got[4] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}


def test_all_turns_gives_every_reasoning_back() -> None:
    items = [user("q1"), reasoning("first", sealed=False), {"role": "assistant", "content": "a1"}, user("q2")]
    assert messages(items, all_turns=True)[1] == {"role": "assistant", "content": "a1", "reasoning_content": "first"}
    assert "reasoning_content" not in messages(items)[1]


def test_reasoning_sealed_elsewhere_is_left_out() -> None:
    foreign = {"type": "reasoning", "id": "rs_9", "summary": [], "encrypted_content": "gAAAAB-openai"}
    got = messages([user("q"), foreign, call("c1"), output("c1")])
    assert "reasoning_content" not in got[1] and got[1]["tool_calls"][0]["id"] == "c1"


def test_custom_and_namespaced_calls_come_back_under_their_chat_names() -> None:
    got = messages([
        {"type": "additional_tools", "role": "developer", "tools": [{"type": "namespace", "name": "functions",
                                                                     "description": "", "tools": [{"type": "custom", "name": "exec"}]}]},
        user("read it"),
        {"type": "custom_tool_call", "call_id": "c1", "name": "exec", "namespace": "functions", "input": "text(1)"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "1"}]},
        call("c2", "spawn_agent", namespace="multi_agent_v1"), output("c2"),
    ])
    assert got[1]["tool_calls"][0]["function"] == {"name": "functions__exec", "arguments": '{"input": "text(1)"}'}
    assert got[2] == {"role": "tool", "tool_call_id": "c1", "content": "1"}
    assert got[3]["tool_calls"][0]["function"]["name"] == "multi_agent_v1__spawn_agent"


@pytest.mark.parametrize(("fields", "param"), [
    ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"include": ["reasoning.encrypted_content", "message.output_text.logprobs"]}, "include"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
])
def test_values_that_cannot_be_honoured(fields: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        translate.check_request(request([user("x")], **fields))
    assert info.value.param == param


def test_accepted_values_of_those_fields() -> None:
    translate.check_request(request([user("x")], background=False, truncation="disabled", top_logprobs=0,
                                    include=["reasoning.encrypted_content", "web_search_call.results"]))


def test_an_output_needs_its_call_and_images_are_refused() -> None:
    with pytest.raises(InvalidRequest) as info:
        messages([user("x"), {"type": "custom_tool_call_output", "call_id": "nope", "output": "1"}])
    assert info.value.param == "input[1].call_id"
    with pytest.raises(InvalidRequest) as info:
        messages([user("x"), call("c1"), {"type": "function_call_output", "call_id": "c1",
                                          "output": [{"type": "input_image", "image_url": "data:,"}]}])
    assert info.value.param == "input[2].output[0]"
