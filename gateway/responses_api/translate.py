"""A Responses request → the backend-neutral `RequestSpec` (a chat request), the response's
frame that echoes it, and the conversation kept for `previous_response_id`.

`input` becomes chat messages: message items by role (text parts only), `function_call` items
an assistant message's `tool_calls`, `function_call_output` items `tool` messages; earlier
reasoning items are accepted and left out (chat templates drop earlier turns' thinking).
`instructions` become the first system message and, as OpenAI does, do not carry over to a
follow-up request. Function tools, `tool_choice` and `text.format` become their chat shapes.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from gateway.errors import from_decode_error
from gateway.responses_api import schemas as R
from gateway.responses_api.encode import new_id
from gateway.service.admission import RouteLimits
from plugins.contract.errors import InvalidRequest
from plugins.contract.protocol import RequestSpec, Sampling

_ITEM_TYPES: dict[str, type[msgspec.Struct]] = {
    "message": R.MessageItem,
    "function_call": R.FunctionCallItem,
    "function_call_output": R.FunctionCallOutputItem,
    "reasoning": R.ReasoningItemIn,
}


def _fail(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def check_request(req: R.ResponsesRequest) -> None:
    if req.background:
        raise _fail("`background` responses are not supported; stream instead.", "background")
    if req.truncation == "auto":
        raise _fail("`truncation` 'auto' is not supported; a prompt too long is a 400.", "truncation")
    if req.top_logprobs:
        raise _fail("`top_logprobs` is not supported on /v1/responses.", "top_logprobs")
    if req.stream_options is not None and not req.stream:
        raise _fail("Stream options can only be defined when `stream` is true.", "stream_options")


def input_items(req: R.ResponsesRequest) -> list[R.InputItem]:
    if isinstance(req.input, str):
        return [R.MessageItem(role="user", content=req.input)]
    items: list[R.InputItem] = []
    for i, raw in enumerate(req.input):
        kind = raw.get("type", "message")
        struct = _ITEM_TYPES.get(kind) if isinstance(kind, str) else None
        if struct is None:
            raise _fail(f"Input items of type {kind!r} are not supported (message, function_call, function_call_output, "
                        "reasoning).", f"input[{i}].type")
        try:
            items.append(msgspec.convert(raw, struct, strict=True))  # type: ignore[arg-type]
        except msgspec.ValidationError as exc:
            error = from_decode_error(exc)
            param = f"input[{i}]" + (f".{error.param}" if error.param else "")
            raise InvalidRequest(error.message.replace(f"`{error.param}`", f"`{param}`") if error.param else error.message,
                                 param=param) from None
    return items


def _text(content: str | list[Any], param: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, (R.InputText, R.OutputTextIn)):
            texts.append(part.text)
        elif isinstance(part, R.RefusalIn):
            texts.append(part.refusal)
        else:
            raise _fail(f"Content parts of type `{type(part).__name__}` are not supported; only text is.", f"{param}[{j}]")
    return "".join(texts)


def to_messages(items: list[R.InputItem], earlier_calls: set[str]) -> list[dict[str, Any]]:
    """Input items → chat messages; `earlier_calls`: the call ids of the stored conversation."""
    messages: list[dict[str, Any]] = []
    called = set(earlier_calls)
    for i, item in enumerate(items):
        if isinstance(item, R.MessageItem):
            text = _text(item.content, f"input[{i}].content")
            if item.role == "user" and isinstance(item.content, list):
                messages.append({"role": "user", "content": [{"type": "text", "text": text}]})
            else:
                messages.append({"role": item.role, "content": text})
        elif isinstance(item, R.FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                # "" rather than None: templates such as the default model's read every message's content
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            called.add(item.call_id)
        elif isinstance(item, R.FunctionCallOutputItem):
            if item.call_id not in called:
                raise _fail(f"No function_call item with call_id {item.call_id!r} comes before this output.",
                            f"input[{i}].call_id")
            output = item.output if isinstance(item.output, str) else "".join(p.text for p in item.output)
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
    return messages


def call_ids(messages: list[dict[str, Any]]) -> set[str]:
    """The ids of the function calls in earlier turns (a follow-up's outputs may answer them)."""
    return {call["id"] for message in messages for call in message.get("tool_calls") or ()}


def chat_tools(req: R.ResponsesRequest) -> list[dict[str, Any]] | None:
    if not req.tools:
        return None
    tools = []
    for i, raw in enumerate(req.tools):
        if raw.get("type") != "function":
            raise _fail(f"Tools of type {raw.get('type')!r} are not supported; only `function` tools are.", f"tools[{i}].type")
        try:
            tool = msgspec.convert(raw, R.FunctionTool, strict=True)
        except msgspec.ValidationError as exc:
            error = from_decode_error(exc)
            raise _fail(error.message, f"tools[{i}]" + (f".{error.param}" if error.param else "")) from None
        function: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        function["parameters"] = tool.parameters if tool.parameters is not None else {"type": "object", "properties": {}}
        if tool.strict is not None:
            function["strict"] = tool.strict
        tools.append({"type": "function", "function": function})
    return tools


def chat_tool_choice(req: R.ResponsesRequest, tools: list[dict[str, Any]] | None) -> str | dict[str, Any] | None:
    choice = req.tool_choice
    if choice is None or choice == "none":
        return choice
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str) or set(choice) != {"type", "name"}:
            raise _fail("`tool_choice` must be 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}.",
                        "tool_choice")
        names = {t["function"]["name"] for t in tools or ()}
        if choice["name"] not in names:
            raise _fail(f"`tool_choice` names function {choice['name']!r}, which is not in `tools`.", "tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}
    if not tools and choice == "required":
        raise _fail("`tool_choice` 'required' needs `tools`.", "tool_choice")
    return choice


def response_format(req: R.ResponsesRequest) -> dict[str, Any] | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or isinstance(fmt, R.FormatText):
        return None
    if isinstance(fmt, R.FormatJSONObject):
        return {"type": "json_object"}
    schema: dict[str, Any] = {"name": fmt.name, "schema": fmt.schema_}
    if fmt.description is not None:
        schema["description"] = fmt.description
    if fmt.strict is not None:
        schema["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": schema}


def to_spec(req: R.ResponsesRequest, *, request_id: str, history: list[dict[str, Any]], turn: list[dict[str, Any]],
            limits: RouteLimits = RouteLimits()) -> RequestSpec:
    """The chat request for this turn: instructions, the stored conversation, the new input; its
    `max_tokens` under the route's `limits`."""
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + history + turn
    if not messages:
        raise _fail("`input` is empty.", "input")
    tools = chat_tools(req)
    tool_choice = chat_tool_choice(req, tools)
    fmt = response_format(req)
    thinking = {"enable_thinking": False} if req.reasoning is not None and req.reasoning.effort == "none" else None
    return RequestSpec(
        request_id=request_id,
        kind="chat",
        model=req.model,
        upstream_model="",
        sampling=Sampling(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            max_tokens=(max_tokens := limits.max_tokens_for(req.model, "max_output_tokens", req.max_output_tokens)),
        ),
        messages=messages,
        stream=bool(req.stream),
        chat_template_kwargs=thinking,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=req.parallel_tool_calls,
        response_format=fmt,
        user=req.user,
        max_tokens_asked=req.max_output_tokens if req.max_output_tokens != max_tokens else None,
    )


def response_frame(req: R.ResponsesRequest, spec: RequestSpec, *, stored: bool) -> R.Response:
    """The response's echo of the request (everything but status, output and usage), its
    `max_output_tokens` the one `spec` is served with."""
    fmt = req.text.format if req.text is not None and req.text.format is not None else R.FormatText()
    return R.Response(
        id=new_id("resp"),
        created_at=int(time.time()),
        status="in_progress",
        instructions=req.instructions,
        max_output_tokens=spec.sampling.max_tokens,
        model=req.model,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        previous_response_id=req.previous_response_id,
        reasoning=R.ReasoningEcho(effort=req.reasoning.effort if req.reasoning else None,
                                  summary=req.reasoning.summary if req.reasoning else None),
        store=stored,
        temperature=1.0 if req.temperature is None else req.temperature,
        text=R.TextFormatEcho(format=msgspec.to_builtins(fmt)),
        tool_choice=req.tool_choice if req.tool_choice is not None else "auto",
        tools=req.tools or [],
        top_p=1.0 if req.top_p is None else req.top_p,
        user=req.user,
        metadata=req.metadata or {},
    )
