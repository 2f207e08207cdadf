"""A Responses request → the backend-neutral `RequestSpec` (a chat request), and the response's
frame that echoes it.

`input` becomes chat messages:
- message items by role (text parts only); `developer` is the chat `system` role, and the
  leading run of system text (`instructions`, then system and developer items) is one system
  message, as chat templates want it;
- `function_call` and `custom_tool_call` items an assistant message's `tool_calls` (named as
  `tools` flattens them), their outputs `tool` messages;
- reasoning items give their text (their `content`, or what this gateway sealed in
  `encrypted_content`) to the assistant message that follows as `reasoning_content`: those
  after the last user message (`reasoning.context` "current_turn", the default), or all of them
  ("all_turns"); the chat template decides whether it shows them. Others are left out;
- `additional_tools` items add their tools (`tools.chat_tools`).

`instructions` do not carry over to a follow-up request (`previous_response_id`), as OpenAI's.
`tool_choice` and `text.format` become their chat shapes.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from gateway.errors import from_decode_error
from gateway.responses_api import response_schemas as O
from gateway.responses_api import schemas as R
from gateway.responses_api.encode import new_id
from gateway.responses_api.reasoning_seal import ReasoningSeal
from gateway.responses_api.tools import ChatTools, chat_tool_choice, chat_tools, custom_arguments, flat_name
from gateway.service.admission import RouteLimits
from plugins.contract.errors import InvalidRequest
from plugins.contract.protocol import RequestSpec, Sampling


def _fail(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def check_request(req: R.ResponsesRequest) -> None:
    """The values of acted-on fields this gateway cannot honour."""
    if req.background:
        raise _fail("`background` responses are not supported; stream instead.", "background")
    if req.truncation == "auto":
        raise _fail("`truncation` 'auto' is not supported; a prompt too long is a 400.", "truncation")
    if req.top_logprobs:
        raise _fail("`top_logprobs` is not supported on /v1/responses.", "top_logprobs")
    if req.include and "message.output_text.logprobs" in req.include:
        raise _fail("`include` 'message.output_text.logprobs' is not supported on /v1/responses.", "include")
    if req.stream_options is not None and not req.stream:
        raise _fail("Stream options can only be defined when `stream` is true.", "stream_options")


def input_items(req: R.ResponsesRequest) -> list[R.InputItem]:
    if isinstance(req.input, str):
        return [R.MessageItem(role="user", content=req.input)]
    items: list[R.InputItem] = []
    for i, raw in enumerate(req.input):
        kind = raw.get("type", "message")
        struct = R.INPUT_ITEMS.get(kind) if isinstance(kind, str) else None
        if struct is None:
            raise _fail(f"Input items of type {kind!r} are not supported ({', '.join(R.INPUT_ITEMS)}).", f"input[{i}].type")
        try:
            items.append(msgspec.convert(raw, struct, strict=True))  # type: ignore[arg-type]
        except msgspec.ValidationError as exc:
            error = from_decode_error(exc)
            param = f"input[{i}]" + (f".{error.param}" if error.param else "")
            raise InvalidRequest(error.message.replace(f"`{error.param}`", f"`{param}`") if error.param else error.message,
                                 param=param) from None
    return items


def request_tools(req: R.ResponsesRequest, items: list[R.InputItem], hosted: str) -> ChatTools:
    """The chat tools of `tools` and of the `additional_tools` items, under `hosted` (the route's
    `hosted_tools`)."""
    groups: list[tuple[str, list[Any]]] = [("tools", req.tools or [])]
    groups += [(f"input[{i}].tools", item.tools) for i, item in enumerate(items) if isinstance(item, R.AdditionalToolsItem)]
    return chat_tools(groups, hosted)


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


def _reasoning_text(item: R.ReasoningItemIn, seal: ReasoningSeal | None) -> str | None:
    if item.content:
        return "".join(part.text for part in item.content)
    if item.encrypted_content is not None and seal is not None:
        return seal.unseal(item.encrypted_content)
    return None


def to_messages(items: list[R.InputItem], earlier_calls: set[str], *, seal: ReasoningSeal | None = None,
                all_turns: bool = False) -> list[dict[str, Any]]:
    """Input items → chat messages; `earlier_calls`: the call ids of the stored conversation;
    `all_turns`: every earlier reasoning goes back, not only the current turn's."""
    messages: list[dict[str, Any]] = []
    called = set(earlier_calls)
    last_user = max((i for i, item in enumerate(items) if isinstance(item, R.MessageItem) and item.role == "user"), default=-1)
    reasoning: list[str] = []  # waiting for the assistant message it belongs to
    for i, item in enumerate(items):
        if isinstance(item, R.ReasoningItemIn):
            text = _reasoning_text(item, seal) if all_turns or i > last_user else None
            if text:
                reasoning.append(text)
            continue
        if isinstance(item, R.MessageItem):
            text = _text(item.content, f"input[{i}].content")
            role = "system" if item.role == "developer" else item.role
            if item.role == "user" and isinstance(item.content, list):
                messages.append({"role": "user", "content": [{"type": "text", "text": text}]})
            else:
                messages.append({"role": role, "content": text})
        elif isinstance(item, (R.FunctionCallItem, R.CustomToolCallItem)):
            arguments = item.arguments if isinstance(item, R.FunctionCallItem) else custom_arguments(item.input)
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": flat_name(item.name, item.namespace), "arguments": arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                # "" rather than None: templates such as the default model's read every message's content
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            called.add(item.call_id)
        elif isinstance(item, (R.FunctionCallOutputItem, R.CustomToolCallOutputItem)):
            if item.call_id not in called:
                raise _fail(f"No call item with call_id {item.call_id!r} comes before this output.", f"input[{i}].call_id")
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output, f"input[{i}].output")})
        else:  # additional_tools: see request_tools
            continue
        if reasoning and messages[-1]["role"] == "assistant":
            earlier = messages[-1].get("reasoning_content")
            messages[-1]["reasoning_content"] = "\n\n".join([earlier, *reasoning] if earlier else reasoning)
        reasoning = []
    return messages


def _system_first(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The leading system messages as one (chat templates take one system message, first)."""
    lead = 0
    while lead < len(messages) and messages[lead]["role"] == "system":
        lead += 1
    if lead < 2:
        return messages
    return [{"role": "system", "content": "\n\n".join(m["content"] for m in messages[:lead])}, *messages[lead:]]


def call_ids(messages: list[dict[str, Any]]) -> set[str]:
    """The ids of the function calls in earlier turns (a follow-up's outputs may answer them)."""
    return {call["id"] for message in messages for call in message.get("tool_calls") or ()}


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
            tools: ChatTools | None = None, limits: RouteLimits = RouteLimits()) -> RequestSpec:
    """The chat request for this turn: instructions, the stored conversation, the new input, the
    chat `tools`; its `max_tokens` under the route's `limits`."""
    messages = _system_first(([{"role": "system", "content": req.instructions}] if req.instructions else []) + history + turn)
    if not messages:
        raise _fail("`input` is empty.", "input")
    tools = tools if tools is not None else ChatTools()
    tool_choice, callable_tools = chat_tool_choice(req.tool_choice, tools)
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
        tools=callable_tools,
        tool_choice=tool_choice,
        parallel_tool_calls=req.parallel_tool_calls,
        response_format=response_format(req),
        user=req.user,
        max_tokens_asked=req.max_output_tokens if req.max_output_tokens != max_tokens else None,
        session=req.prompt_cache_key,
    )


def response_frame(req: R.ResponsesRequest, spec: RequestSpec, *, stored: bool, tools: ChatTools | None = None) -> O.Response:
    """The response's echo of the request (everything but status, output and usage), its
    `max_output_tokens` the one `spec` is served with, its `tools` those offered to the model."""
    fmt = req.text.format if req.text is not None and req.text.format is not None else R.FormatText()
    reasoning = req.reasoning
    return O.Response(
        id=new_id("resp"),
        created_at=int(time.time()),
        status="in_progress",
        instructions=req.instructions,
        max_output_tokens=spec.sampling.max_tokens,
        model=req.model,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        previous_response_id=req.previous_response_id,
        reasoning=O.ReasoningEcho(effort=reasoning.effort if reasoning else None,
                                  summary=reasoning.summary if reasoning else None,
                                  context=reasoning.context if reasoning else None),
        store=stored,
        temperature=1.0 if req.temperature is None else req.temperature,
        text=O.TextFormatEcho(format=msgspec.to_builtins(fmt), verbosity=req.text.verbosity if req.text else None),
        tool_choice=msgspec.to_builtins(req.tool_choice) if req.tool_choice is not None else "auto",
        tools=tools.echo if tools is not None else [],
        top_p=1.0 if req.top_p is None else req.top_p,
        user=req.user,
        metadata=req.metadata or {},
        prompt_cache_key=req.prompt_cache_key,
    )
