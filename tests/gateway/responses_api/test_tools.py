"""Responses tools → chat tools and back (gateway/responses_api/tools.py): namespaces flattened,
custom tools as a function of one string, hosted tools dropped or refused, `tool_choice`."""

from __future__ import annotations

import json

import msgspec
import pytest

from gateway.responses_api import schemas as R
from gateway.responses_api.tools import ToolRef, chat_tool_choice, chat_tools, custom_arguments, custom_input
from plugins.contract.errors import InvalidRequest

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": False}
AGENTS = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
          "tools": [{"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}]}
EXEC = {"type": "custom", "name": "exec", "description": "Run JavaScript.",
        "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
FUNCTIONS = {"type": "namespace", "name": "functions", "description": "", "tools": [EXEC]}


def tools_of(*raw: dict) -> list:
    return msgspec.convert(list(raw), list[R.Tool])


def test_function_namespace_and_custom_tools() -> None:
    out = chat_tools([("tools", tools_of(WEATHER, AGENTS, {"type": "web_search", "external_web_access": False}))], "drop")
    names = [t["function"]["name"] for t in out.tools]
    assert names == ["get_weather", "multi_agent_v1__spawn_agent"]
    assert out.tools[0]["function"] == {"name": "get_weather", "description": "The weather.",
                                        "parameters": WEATHER["parameters"], "strict": False}
    assert out.ref("multi_agent_v1__spawn_agent") == ToolRef("spawn_agent", "multi_agent_v1", custom=False)
    assert out.ref("nonexistent") == ToolRef("nonexistent")  # a name no tool has stays a plain function call
    assert out.dropped == ["web_search"]
    assert [t["type"] for t in out.echo] == ["function", "namespace"]  # the dropped tool is not echoed


def test_custom_tool_is_a_function_of_one_string_with_its_grammar_shown() -> None:
    out = chat_tools([("input[0].tools", tools_of(FUNCTIONS))], "drop")
    (tool,) = out.tools
    function = tool["function"]
    assert function["name"] == "functions__exec" and function["description"] == "Run JavaScript."
    assert function["parameters"]["required"] == ["input"]
    assert "lark grammar" in function["parameters"]["properties"]["input"]["description"]
    assert "start: /.+/" in function["parameters"]["properties"]["input"]["description"]
    assert out.ref("functions__exec") == ToolRef("exec", "functions", custom=True)


def test_custom_input_round_trips_and_falls_back_to_the_raw_text() -> None:
    code = 'const r = await tools.exec_command({cmd: "cat x"});\ntext(r);'
    assert json.loads(custom_arguments(code)) == {"input": code}
    assert custom_input(custom_arguments(code)) == code
    assert custom_input("not json at all") == "not json at all"
    assert custom_input('{"other": 1}') == '{"other": 1}'


def test_hosted_tools_rejected_by_a_route_that_says_so() -> None:
    hosted = tools_of(WEATHER, {"type": "file_search", "vector_store_ids": ["vs_1"]})
    with pytest.raises(InvalidRequest) as info:
        chat_tools([("tools", hosted)], "reject")
    assert info.value.param == "tools[1].type" and "file_search" in info.value.message
    with pytest.raises(InvalidRequest) as info:
        chat_tools([("tools", []), ("input[3].tools", tools_of({"type": "mcp", "server_label": "x"}))], "reject")
    assert info.value.param == "input[3].tools[0].type"


def test_two_tools_of_one_name_are_refused() -> None:
    clash = {"type": "function", "name": "multi_agent_v1__spawn_agent"}
    with pytest.raises(InvalidRequest) as info:
        chat_tools([("tools", tools_of(clash, AGENTS))], "drop")
    assert info.value.param == "tools[1].tools[0].name"


def choice(raw: object, *tools: dict):
    decoded = msgspec.convert({"model": "m", "input": "x", "tool_choice": raw}, R.ResponsesRequest).tool_choice
    return chat_tool_choice(decoded, chat_tools([("tools", tools_of(*tools))], "drop"))


def test_tool_choice() -> None:
    assert choice("auto", WEATHER)[0] == "auto"
    assert choice({"type": "function", "name": "get_weather"}, WEATHER)[0] == {"type": "function",
                                                                                "function": {"name": "get_weather"}}
    assert choice({"type": "custom", "name": "exec"}, FUNCTIONS)[0] == {"type": "function",
                                                                         "function": {"name": "functions__exec"}}
    picked, kept = choice({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_weather"}]},
                          WEATHER, AGENTS)
    assert picked == "required" and [t["function"]["name"] for t in kept] == ["get_weather"]
    for bad, message in [
        ({"type": "function", "name": "nope"}, "not in `tools`"),
        ({"type": "web_search_preview"}, "hosted tool"),
        ({"type": "mcp", "server_label": "x"}, "hosted tool"),
        ("required", "needs `tools`"),
    ]:
        with pytest.raises(InvalidRequest) as info:
            choice(bad)
        assert info.value.param == "tool_choice" and message in info.value.message
