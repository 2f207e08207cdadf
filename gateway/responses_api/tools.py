"""Responses tools → the chat tools a backend takes, and the names the model calls back to the
Responses items they stand for.

- `function` tools stay as they are.
- `namespace` tools are flattened: a chat template knows one list of functions, so each inner
  tool becomes `<namespace>__<name>` (`multi_agent_v1__spawn_agent`).
- `custom` tools (free text in, not JSON) become a function taking `{"input": "<text>"}`; a
  grammar, if the tool has one, is written into that parameter's description for the model.
- hosted tools (`schemas.HOSTED_TOOL_TYPES`: web search, file search, code interpreter, MCP...)
  run on OpenAI's side; no engine here can run them. The route's `hosted_tools` decides: "drop"
  leaves them out (the handler names them in `x-switchyard-dropped-tools` and counts them),
  "reject" is a 400 naming the tool.
- the tools of `additional_tools` input items join the list (one list per chat template).

`ToolNames` maps a called name back: a call of `multi_agent_v1__spawn_agent` is a
`function_call` item named `spawn_agent` with `namespace: "multi_agent_v1"`; a call of a custom
tool is a `custom_tool_call` whose `input` is the call's `input` argument.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.responses_api import schemas as R
from plugins.contract.errors import InvalidRequest

SEPARATOR = "__"
CUSTOM_ARGUMENT = "input"


@dataclass(frozen=True)
class ToolRef:
    """What a flat chat tool name stands for."""

    name: str
    namespace: str | None = None
    custom: bool = False


def flat_name(name: str, namespace: str | None) -> str:
    return name if namespace is None else f"{namespace}{SEPARATOR}{name}"


def custom_arguments(text: str) -> str:
    """A custom tool's free-text input as the arguments of the function that stands for it."""
    return json.dumps({CUSTOM_ARGUMENT: text}, ensure_ascii=False)


def custom_input(arguments: str) -> str:
    """The free text back out of those arguments (the arguments as they are when the model
    wrote something else)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    text = value.get(CUSTOM_ARGUMENT) if isinstance(value, dict) else None
    return text if isinstance(text, str) else arguments


@dataclass
class ChatTools:
    """The chat tools for one request (None: none), what each name stands for, the hosted tool
    types left out (`hosted_tools = "drop"`), and what the response echoes in `tools` (the
    request's `tools` less those left out)."""

    tools: list[dict[str, Any]] | None = None
    names: dict[str, ToolRef] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    echo: list[dict[str, Any]] = field(default_factory=list)

    def ref(self, flat: str) -> ToolRef:
        """What the model's call of `flat` stands for (a name no tool has: a plain function)."""
        return self.names.get(flat) or ToolRef(flat)


def chat_tools(groups: Sequence[tuple[str, Sequence[Any]]], hosted: str) -> ChatTools:
    """The tools of `groups` (`(param, tools)`: the request's `tools`, each `additional_tools`
    item's), under the route's `hosted` policy ("drop" or "reject")."""
    out = ChatTools()
    for param, tools in groups:
        for i, tool in enumerate(tools):
            where = f"{param}[{i}]"
            if isinstance(tool, R.NamespaceTool):
                for j, inner in enumerate(tool.tools):
                    _add(out, inner, tool.name, f"{where}.tools[{j}]")
            elif isinstance(tool, (R.FunctionTool, R.CustomTool)):
                _add(out, tool, None, where)
            else:
                kind = tool.__struct_config__.tag
                if hosted == "reject":
                    raise InvalidRequest(f"Tools of type `{kind}` run on OpenAI's side; no engine here can run them (this "
                                         "route's `hosted_tools` is \"reject\").", param=f"{where}.type")
                if kind not in out.dropped:
                    out.dropped.append(kind)
                continue
            if param == "tools":
                out.echo.append(msgspec.to_builtins(tool))
    return out


def _add(out: ChatTools, tool: R.FunctionTool | R.CustomTool, namespace: str | None, where: str) -> None:
    flat = flat_name(tool.name, namespace)
    if flat in out.names:
        raise InvalidRequest(f"Two tools are called `{flat}`.", param=f"{where}.name")
    out.names[flat] = ToolRef(tool.name, namespace, isinstance(tool, R.CustomTool))
    function: dict[str, Any] = {"name": flat}
    description = tool.description
    if isinstance(tool, R.FunctionTool):
        if description is not None:
            function["description"] = description
        function["parameters"] = tool.parameters if tool.parameters is not None else {"type": "object", "properties": {}}
        if tool.strict is not None:
            function["strict"] = tool.strict
    else:
        if description:
            function["description"] = description
        function["parameters"] = {
            "type": "object",
            "properties": {CUSTOM_ARGUMENT: {"type": "string", "description": _custom_format(tool.format)}},
            "required": [CUSTOM_ARGUMENT],
            "additionalProperties": False,
        }
    if out.tools is None:
        out.tools = []
    out.tools.append({"type": "function", "function": function})


def _custom_format(fmt: R.FormatText | R.FormatGrammar | None) -> str:
    if isinstance(fmt, R.FormatGrammar):
        return f"The tool's input as raw text (not JSON), matching this {fmt.syntax} grammar:\n{fmt.definition}"
    return "The tool's input as raw text (not JSON)."


def chat_tool_choice(choice: Any, tools: ChatTools) -> tuple[str | dict[str, Any] | None, list[dict[str, Any]] | None]:
    """The chat `tool_choice` for a Responses one, and the chat tools it leaves callable
    (`allowed_tools` narrows them)."""
    listed = tools.tools
    if choice is None or choice in ("none", "auto"):
        return choice, listed
    if choice == "required":
        if not listed:
            raise InvalidRequest("`tool_choice` 'required' needs `tools`.", param="tool_choice")
        return choice, listed
    if isinstance(choice, (R.ToolChoiceFunction, R.ToolChoiceCustom)):
        custom = isinstance(choice, R.ToolChoiceCustom)
        flat = _find(tools, choice.name, custom)
        if flat is None:
            kind = "custom tool" if custom else "function"
            raise InvalidRequest(f"`tool_choice` names {kind} {choice.name!r}, which is not in `tools`.", param="tool_choice")
        return {"type": "function", "function": {"name": flat}}, listed
    if isinstance(choice, R.ToolChoiceAllowed):
        allowed = set()
        for i, entry in enumerate(choice.tools):
            name = entry.get("name")
            flat = _find(tools, name, entry.get("type") == "custom") if isinstance(name, str) else None
            if flat is None and entry.get("type") in ("function", "custom"):
                raise InvalidRequest(f"`tool_choice.tools[{i}]` names a tool that is not in `tools`.",
                                     param=f"tool_choice.tools[{i}]")
            allowed.add(flat)
        kept = [t for t in listed or () if t["function"]["name"] in allowed]
        if choice.mode == "required" and not kept:
            raise InvalidRequest("`tool_choice` requires a call of none of the tools that can run here.", param="tool_choice")
        return (choice.mode if kept else "none"), (kept or None)
    kind = choice.__struct_config__.tag
    raise InvalidRequest(f"`tool_choice` forces the hosted tool `{kind}`, which no engine here can run.", param="tool_choice")


def _find(tools: ChatTools, name: str, custom: bool) -> str | None:
    """The flat name of the function (or custom tool) `name`: a flat name, else the one tool of
    that name (a top-level one first)."""
    kind = {flat: ref for flat, ref in tools.names.items() if ref.custom == custom}
    if name in kind:
        return name
    named = sorted((ref.namespace is not None, flat) for flat, ref in kind.items() if ref.name == name)
    if len(named) == 1 or (len(named) > 1 and not named[0][0] and named[1][0]):
        return named[0][1]
    return None
