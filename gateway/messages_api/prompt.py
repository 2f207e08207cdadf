"""A Messages conversation as OpenAI-shaped chat messages and tools, which chat templates and
upstream servers consume (`translate` builds the request around it).

- `system` first; a `role: "system"` turn inside `messages` (beta: Claude Code's environment,
  right after the first user turn) stays where it is, as a system message: ChatML templates
  render it in place, the built-in engine folds it into the first system message when its
  template refuses a system message there, and an upstream server renders it as its own
  template does. One with `clear_at: "next_user_message"` is left out once a later user turn
  exists; its `output_config.effort` is the turn's effort (`effort`).
- A user turn's `tool_result` blocks become `tool` messages (before the turn's text, right after
  the assistant's calls); an assistant turn's `tool_use` blocks become `tool_calls` and its
  `thinking` blocks `reasoning_content`. A conversation that ends with an assistant turn is
  continued (Anthropic's prefill: `continue_final_message`).
- Tools: those with `defer_loading` are left out until a `tool_reference` in a tool result (the
  tool search's answer) names them; `tool_addition` / `tool_removal` blocks (beta) add or
  withdraw one, so the model is offered the tools in force at the end of the conversation.
  `tool_choice` any / tool / none map to required / a named function / none.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.messages_api import schemas as M
from plugins.contract.errors import InvalidRequest


class Prompt:
    """The chat-shaped conversation of a Messages request and what goes with it."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] | None = None
        self.tool_choice: str | dict[str, Any] | None = None
        self.parallel_tool_calls: bool | None = None
        self.continues = False
        self.effort: M.Effort | None = None  # the last system turn's, if one set it
        self._known: dict[str, M.Tool] = {}  # every tool by name: declared or added inline
        self._offered: dict[str, bool] = {}  # name -> offered now (insertion order: the tools' order)

    @classmethod
    def of(cls, req: M._Conversation) -> Prompt:
        prompt = cls()
        prompt._declare(req.tools)
        system = _text(req.system)
        if system:
            prompt.messages.append({"role": "system", "content": system})
        last_user = max((i for i, m in enumerate(req.messages) if isinstance(m, M.UserMessage)), default=-1)
        last = len(req.messages) - 1
        for i, message in enumerate(req.messages):
            if isinstance(message, M.SystemMessage):
                prompt._system_turn(message, i, shown=message.clear_at != "next_user_message" or i > last_user)
                continue
            if not message.content and not (i == last and isinstance(message, M.AssistantMessage)):
                raise InvalidRequest(f"`messages[{i}]` has empty content; every message needs some, except an "
                                     "optional final assistant message.", param=f"messages[{i}].content")
            if isinstance(message, M.UserMessage):
                prompt.messages += prompt._user_messages(message, i)
            else:
                prompt.messages.append(_assistant_message(message))
        prompt.continues = isinstance(req.messages[-1], M.AssistantMessage)
        prompt._tools(req.tool_choice)
        return prompt

    # -- turns ------------------------------------------------------------------------------------

    def _system_turn(self, message: M.SystemMessage, i: int, *, shown: bool) -> None:
        where = f"messages[{i}]"
        if not message.content and message.output_config is None:
            raise InvalidRequest(f"`{where}` is a system message with neither content nor `output_config`.",
                                 param=f"{where}.content")
        if message.output_config is not None and message.output_config.effort is not None:
            self.effort = message.output_config.effort
        if isinstance(message.content, list):
            texts = []
            for j, block in enumerate(message.content):
                if isinstance(block, M.TextBlock):
                    texts.append(block.text)
                else:
                    self._change_tools(block, f"{where}.content[{j}]")
            text = "\n".join(texts)
        else:
            text = message.content or ""
        if text and shown:
            self.messages.append({"role": "system", "content": text})

    def _user_messages(self, message: M.UserMessage, i: int) -> list[dict[str, Any]]:
        """A user turn: its tool results as `tool` messages, then its text (if any)."""
        if isinstance(message.content, str):
            return [{"role": "user", "content": message.content}]
        results: list[dict[str, Any]] = []
        texts: list[str] = []
        for j, block in enumerate(message.content):
            where = f"messages[{i}].content[{j}]"
            if isinstance(block, M.TextBlock):
                texts.append(block.text)
            elif isinstance(block, M.ToolResultBlock):
                results.append({"role": "tool", "tool_call_id": block.tool_use_id,
                                "content": self._tool_result_text(block, where)})
            elif isinstance(block, (M.ToolAdditionBlock, M.ToolRemovalBlock)):
                self._change_tools(block, where)
            else:
                raise _unsupported(block, where)
        if texts or not results:
            results.append({"role": "user", "content": "\n".join(texts)})
        return results

    def _tool_result_text(self, block: M.ToolResultBlock, where: str) -> str:
        content = block.content
        if content is None or isinstance(content, str):
            text = content or ""
        else:
            parts = []
            for k, part in enumerate(content):
                if isinstance(part, M.TextBlock):
                    parts.append(part.text)
                elif isinstance(part, M.ToolReferenceBlock):
                    self._load(part.tool_name, f"{where}.content[{k}].tool_name")
                    parts.append(f"Tool `{part.tool_name}` is now available.")
                else:
                    raise _unsupported(part, f"{where}.content[{k}]")
            text = "\n".join(parts)
        # chat templates have no place for Anthropic's flag: the model reads it in the text
        return f"Error: {text}" if block.is_error else text

    # -- tools ------------------------------------------------------------------------------------

    def _declare(self, tools: list[M.Tool] | None) -> None:
        for tool in tools or ():
            self._known[tool.name] = tool
            self._offered[tool.name] = not tool.defer_loading

    def _load(self, name: str, where: str) -> None:
        if name not in self._known:
            raise InvalidRequest(f"`{where}` names tool {name!r}, which is not in `tools`.", param=where)
        self._offered[name] = True

    def _change_tools(self, block: M.ToolAdditionBlock | M.ToolRemovalBlock, where: str) -> None:
        ref = block.tool
        if isinstance(ref, (M.MCPToolRef, M.MCPToolsetRef)):
            raise InvalidRequest(f"`{where}.tool` refers to an MCP server; no MCP servers are connected here.",
                                 param=f"{where}.tool")
        if isinstance(ref, M.ToolDefinitionRef):
            self._known[ref.definition.name] = ref.definition
            self._offered.pop(ref.definition.name, None)  # an inline definition goes last
            self._offered[ref.definition.name] = True
        elif isinstance(block, M.ToolAdditionBlock):
            self._load(ref.name, f"{where}.tool.name")
        elif ref.name in self._offered:
            self._offered[ref.name] = False
        else:
            raise InvalidRequest(f"`{where}.tool.name` names tool {ref.name!r}, which is not in `tools`.",
                                 param=f"{where}.tool.name")

    def _tools(self, choice: M.ToolChoice | None) -> None:
        if isinstance(choice, M.ToolChoiceTool):
            if choice.name not in self._known:
                raise InvalidRequest(f"`tool_choice` names tool {choice.name!r}, which is not in `tools`.",
                                     param="tool_choice.name")
            self._offered[choice.name] = True  # a forced call needs its tool, deferred or not
        offered = [self._known[name] for name, on in self._offered.items() if on]
        if offered:
            self.tools = [{"type": "function", "function": _function(tool)} for tool in offered]
        if choice is None:
            return
        if not isinstance(choice, M.ToolChoiceNone) and not offered:
            raise InvalidRequest(f"`tool_choice` of type `{_tag(choice)}` needs `tools` (not all deferred).",
                                 param="tool_choice")
        if isinstance(choice, M.ToolChoiceTool):
            self.tool_choice = {"type": "function", "function": {"name": choice.name}}
        else:
            self.tool_choice = {M.ToolChoiceAuto: "auto", M.ToolChoiceAny: "required", M.ToolChoiceNone: "none"}[type(choice)]
        if getattr(choice, "disable_parallel_tool_use", None):
            self.parallel_tool_calls = False


def _tag(struct: Any) -> str:
    return type(struct).__struct_config__.tag  # type: ignore[no-any-return]


def _function(tool: M.Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    function["parameters"] = tool.input_schema
    return function


def _text(system: str | list[M.TextBlock] | None) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    return "\n".join(block.text for block in system)


def _unsupported(block: Any, where: str) -> InvalidRequest:
    return InvalidRequest(f"`{_tag(block)}` content blocks are not supported; send text.", param=where)


def _assistant_message(message: M.AssistantMessage) -> dict[str, Any]:
    if isinstance(message.content, str):
        return {"role": "assistant", "content": message.content}
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, M.TextBlock):
            texts.append(block.text)
        elif isinstance(block, M.ThinkingBlock):
            reasoning.append(block.thinking)
        elif isinstance(block, M.ToolUseBlock):
            arguments = json.dumps(block.input, ensure_ascii=False)
            calls.append({"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}})
        # redacted_thinking: opaque to any engine here; accepted so that a client can send a
        # conversation back as it received it
    # "" rather than null beside tool calls: templates without tool support concatenate content
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        out["tool_calls"] = calls
    if reasoning:
        out["reasoning_content"] = "".join(reasoning)
    return out
