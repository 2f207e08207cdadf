"""A Messages request → the backend-neutral `RequestSpec` (and a count_tokens request → a
`TokenizeRequest`), so every backend serves Anthropic's clients through the same events.

The conversation becomes OpenAI-shaped chat messages, which chat templates and upstream servers
consume: `system` first; a user turn's `tool_result` blocks become `tool` messages (before the
turn's text, right after the assistant's calls); an assistant turn's `tool_use` blocks become
`tool_calls` and its `thinking` blocks `reasoning_content`. A conversation that ends with an
assistant turn is continued (Anthropic's prefill: `continue_final_message`). `tool_choice`
any / tool / none map to required / a named function / none; `thinking` switches the template's
`enable_thinking`; `metadata.user_id` is the request's `user` (a sticky route's key).
"""

from __future__ import annotations

import json
from typing import Any

from gateway.messages_api import schemas as M
from gateway.service.admission import RouteLimits
from plugins.contract.errors import InvalidRequest
from plugins.contract.protocol import RequestSpec, Sampling, TokenizeRequest


def messages_spec(req: M.MessagesRequest, *, request_id: str, limits: RouteLimits = RouteLimits()) -> RequestSpec:
    """The request spec, its `max_tokens` under the route's `limits`."""
    if isinstance(req.thinking, M.ThinkingEnabled) and req.thinking.budget_tokens >= req.max_tokens:
        raise InvalidRequest("`thinking.budget_tokens` must be less than `max_tokens`.", param="thinking.budget_tokens")
    prompt = _Prompt.of(req)
    extensions = set(prompt.extensions)
    if req.top_k:
        extensions.add("top_k")
    sampling = Sampling(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=req.top_k or None,
        max_tokens=(max_tokens := limits.max_tokens_for(req.model, "max_tokens", req.max_tokens)),
        stop=tuple(req.stop_sequences or ()),
    )
    return RequestSpec(
        request_id=request_id,
        kind="chat",
        model=req.model,
        upstream_model="",
        sampling=sampling,
        messages=prompt.messages,
        stream=bool(req.stream),
        chat_template_kwargs=prompt.template_kwargs,
        add_generation_prompt=not prompt.continues,
        continue_final_message=prompt.continues,
        tools=prompt.tools,
        tool_choice=prompt.tool_choice,
        parallel_tool_calls=prompt.parallel_tool_calls,
        user=req.metadata.user_id if req.metadata is not None else None,
        extensions=frozenset(extensions),
        max_tokens_asked=req.max_tokens if req.max_tokens != max_tokens else None,
    )


def count_tokens_request(req: M.CountTokensRequest, *, upstream_model: str) -> TokenizeRequest:
    """The prompt a create request with the same conversation would send, to tokenize: its
    length is that request's `input_tokens` + `cache_read_input_tokens`."""
    prompt = _Prompt.of(req)
    return TokenizeRequest(
        upstream_model=upstream_model,
        messages=prompt.messages,
        add_special_tokens=False,
        add_generation_prompt=not prompt.continues,
        continue_final_message=prompt.continues,
        chat_template_kwargs=prompt.template_kwargs,
        tools=prompt.tools,
    )


class _Prompt:
    """The chat-shaped conversation of a Messages request and what goes with it."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] | None = None
        self.tool_choice: str | dict[str, Any] | None = None
        self.parallel_tool_calls: bool | None = None
        self.template_kwargs: dict[str, Any] | None = None
        self.continues = False
        self.extensions: set[str] = set()

    @classmethod
    def of(cls, req: M._Conversation) -> _Prompt:
        prompt = cls()
        system = _system_text(req.system)
        if system:
            prompt.messages.append({"role": "system", "content": system})
        last = len(req.messages) - 1
        for i, message in enumerate(req.messages):
            if not message.content and not (i == last and isinstance(message, M.AssistantMessage)):
                raise InvalidRequest(f"`messages[{i}]` has empty content; every message needs some, except an "
                                     "optional final assistant message.", param=f"messages[{i}].content")
            if isinstance(message, M.UserMessage):
                prompt.messages += _user_messages(message, i)
            else:
                prompt.messages.append(_assistant_message(message, i))
        if isinstance(req.messages[-1], M.AssistantMessage):
            prompt.continues = True
            prompt.extensions |= {"continue_final_message", "add_generation_prompt"}
        prompt._tools(req)
        if req.thinking is not None:
            prompt.template_kwargs = {"enable_thinking": not isinstance(req.thinking, M.ThinkingDisabled)}
            prompt.extensions.add("chat_template_kwargs")
        return prompt

    def _tools(self, req: M._Conversation) -> None:
        choice = req.tool_choice
        if req.tools is not None and not req.tools:
            raise InvalidRequest("`tools` must not be an empty list; leave it out instead.", param="tools")
        if req.tools:
            self.tools = [
                {"type": "function", "function": _function(tool)} for tool in req.tools
            ]
        if choice is None:
            return
        if not isinstance(choice, M.ToolChoiceNone) and not req.tools:
            raise InvalidRequest(f"`tool_choice` of type `{_tag(choice)}` needs `tools`.", param="tool_choice")
        if isinstance(choice, M.ToolChoiceTool):
            if choice.name not in {t.name for t in req.tools or ()}:
                raise InvalidRequest(f"`tool_choice` names tool {choice.name!r}, which is not in `tools`.",
                                     param="tool_choice.name")
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


def _system_text(system: str | list[M.TextBlock] | None) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    return "\n".join(block.text for block in system)


def _unsupported(block: Any, where: str) -> InvalidRequest:
    return InvalidRequest(f"`{_tag(block)}` content blocks are not supported; send text.", param=where)


def _user_messages(message: M.UserMessage, i: int) -> list[dict[str, Any]]:
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
            results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": _tool_result_text(block, where)})
        else:
            raise _unsupported(block, where)
    if texts or not results:
        results.append({"role": "user", "content": "\n".join(texts)})
    return results


def _tool_result_text(block: M.ToolResultBlock, where: str) -> str:
    content = block.content
    if content is None or isinstance(content, str):
        text = content or ""
    else:
        parts = []
        for k, part in enumerate(content):
            if not isinstance(part, M.TextBlock):
                raise _unsupported(part, f"{where}.content[{k}]")
            parts.append(part.text)
        text = "\n".join(parts)
    # chat templates have no place for Anthropic's flag: the model reads it in the text
    return f"Error: {text}" if block.is_error else text


def _assistant_message(message: M.AssistantMessage, i: int) -> dict[str, Any]:
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
