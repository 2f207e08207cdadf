"""Cross-field rules of the OpenAI contract and vLLM's extensions, and the translation of a
decoded request into the backend-neutral `RequestSpec`.

Each rule raises `InvalidRequest` with a message a person understands and `param` set. Per-field
types and ranges are already enforced by the structs in `gateway/chat_api/schemas.py`.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from typing import Any, Literal

import msgspec

from gateway.chat_api import schemas as S
from gateway.chat_api.fields import CHAT_FIELDS, COMPLETIONS_FIELDS
from gateway.service.admission import RouteLimits
from plugins.contract.errors import InvalidRequest
from plugins.contract.protocol import EXTENSIONS, RequestSpec, Sampling

COMPLETIONS_MAX_TOKENS = 16  # legacy completions' own default, as OpenAI's


def _fail(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def check_common(req: S.SamplingFields, *, max_n: int) -> None:
    if req.stream_options is not None and not req.stream:
        raise _fail("Stream options can only be defined when `stream` is true.", "stream_options")
    if req.n is not None and req.n > max_n:
        raise _fail(f"`n` is {req.n}, more than this server allows ({max_n}).", "n")
    if req.max_tokens is not None and req.max_tokens < 1 and not getattr(req, "echo", False):
        raise _fail("`max_tokens` must be at least 1.", "max_tokens")
    if req.min_tokens and req.max_tokens is not None and req.min_tokens > req.max_tokens:
        raise _fail(f"`min_tokens` ({req.min_tokens}) is larger than `max_tokens` ({req.max_tokens}).", "min_tokens")
    if req.logit_bias:
        for key in req.logit_bias:
            if not key.lstrip("-").isdigit() or int(key) < 0:
                raise _fail(f"`logit_bias` keys must be token ids; {key!r} is not.", "logit_bias")
    if isinstance(req.stop, list) and any(s == "" for s in req.stop) or req.stop == "":
        raise _fail("`stop` strings must not be empty.", "stop")
    _check_structured_outputs(req)


def _check_structured_outputs(req: S.SamplingFields) -> None:
    rf = req.response_format
    if isinstance(rf, S.ResponseFormatJSONSchema) and rf.json_schema is None:
        raise _fail("`response_format` of type `json_schema` needs a `json_schema` object.", "response_format.json_schema")
    so = req.structured_outputs
    if so is None:
        return
    kinds = [k for k in ("json", "regex", "choice", "grammar", "json_object", "structural_tag") if getattr(so, k)]
    if len(kinds) != 1:
        raise _fail(
            "`structured_outputs` needs exactly one of json, regex, choice, grammar, json_object, structural_tag"
            + (f"; got {', '.join(kinds)}." if kinds else "."),
            "structured_outputs",
        )
    if rf is not None and not isinstance(rf, S.ResponseFormatText):
        raise _fail("Use either `structured_outputs` or a JSON `response_format`, not both.", "response_format")


def check_chat(req: S.ChatCompletionRequest, *, max_n: int) -> None:
    check_common(req, max_n=max_n)
    if req.max_completion_tokens is not None:
        if req.max_completion_tokens < 1:
            raise _fail("`max_completion_tokens` must be at least 1.", "max_completion_tokens")
        if req.min_tokens and req.min_tokens > req.max_completion_tokens:
            raise _fail(
                f"`min_tokens` ({req.min_tokens}) is larger than `max_completion_tokens` ({req.max_completion_tokens}).",
                "min_tokens",
            )
    if req.top_logprobs and not req.logprobs:
        raise _fail("`top_logprobs` needs `logprobs` set to true.", "top_logprobs")
    if req.continue_final_message and req.add_generation_prompt:
        raise _fail(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to true.", "continue_final_message"
        )
    if req.continue_final_message and not isinstance(req.messages[-1], S.AssistantMessage):
        raise _fail("`continue_final_message` needs the last message to be from the assistant.", "messages")
    if req.modalities and "audio" in req.modalities:
        raise _fail("Audio output is not supported.", "modalities")
    _check_tools(req)
    _check_messages(req.messages)


def _check_tools(req: S.ChatCompletionRequest) -> None:
    if req.tools is not None and not req.tools:
        raise _fail("`tools` must not be an empty list; leave it out instead.", "tools")
    choice = req.tool_choice
    if choice is None or choice == "none":
        return
    if not req.tools:
        raise _fail(f"`tool_choice` {_describe(choice)} needs `tools`.", "tool_choice")
    if isinstance(choice, S.NamedToolChoice):
        names = {t.function.name for t in req.tools}
        if choice.function.name not in names:
            raise _fail(f"`tool_choice` names function {choice.function.name!r}, which is not in `tools`.", "tool_choice")
    if isinstance(choice, S.NamedToolChoice) or choice == "required":
        # the tool call's own schema constrains the output; a second constraint cannot also hold
        if req.structured_outputs is not None:
            which = "a named `tool_choice`" if isinstance(choice, S.NamedToolChoice) else "`tool_choice` 'required'"
            raise _fail(f"`structured_outputs` cannot be combined with {which}.", "structured_outputs")


def _describe(choice: Any) -> str:
    return repr(choice) if isinstance(choice, str) else repr(choice.function.name)


def _check_messages(messages: list[S.Message]) -> None:
    known_call_ids: set[str] = set()
    for i, message in enumerate(messages):
        if isinstance(message, S.AssistantMessage):
            if message.content is None and not message.tool_calls and message.function_call is None:
                raise _fail(f"Assistant message {i} needs `content` or `tool_calls`.", f"messages[{i}].content")
            for call in message.tool_calls or ():
                known_call_ids.add(call.id)
        elif isinstance(message, S.ToolMessage):
            if known_call_ids and message.tool_call_id not in known_call_ids:
                raise _fail(
                    f"Tool message {i} answers `tool_call_id` {message.tool_call_id!r}, which no earlier assistant "
                    "message called.",
                    f"messages[{i}].tool_call_id",
                )
        elif isinstance(message, S.UserMessage) and isinstance(message.content, list):
            for j, part in enumerate(message.content):
                if not isinstance(part, S.TextPart):
                    raise _fail(
                        f"Message {i} has a `{part.__class__.__name__}` content part; only text is supported.",
                        f"messages[{i}].content[{j}]",
                    )


def check_completion(req: S.CompletionRequest, *, max_n: int) -> None:
    check_common(req, max_n=max_n)
    if req.best_of is not None and req.best_of != (req.n or 1):
        raise _fail("`best_of` other than `n` is not supported.", "best_of")
    prompt = req.prompt
    if isinstance(prompt, list) and len({type(p) for p in prompt}) > 1:
        raise _fail(
            "`prompt` must be a string, a list of strings, a list of token ids or a list of token-id lists, not a mixture.",
            "prompt",
        )
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) and len(prompt) > 1:
        raise _fail("Only one prompt per request is supported; send several requests.", "prompt")


_EXTENSION_FIELDS: dict[type, tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]]] = {}


def _extension_fields(struct: type) -> tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]]:
    """The extensions `struct` has a field for, in `EXTENSIONS`' own order, and one getter of
    all their values (no `getattr` call per name and request)."""
    names = tuple(name for name in EXTENSIONS if name in struct.__struct_fields__)  # type: ignore[attr-defined]
    get = operator.attrgetter(*names) if len(names) > 1 else (lambda req: tuple(getattr(req, n) for n in names))
    _EXTENSION_FIELDS[struct] = names, get
    return names, get


def extensions_used(req: S.SamplingFields) -> frozenset[str]:
    names, get = _EXTENSION_FIELDS.get(type(req)) or _extension_fields(type(req))
    values = get(req)
    used = set() if values.count(None) == len(values) else {name for name, value in zip(names, values) if value is not None}
    if req.stream_options is not None and req.stream_options.continuous_usage_stats:
        used.add("continuous_usage_stats")
    return frozenset(used)


def _stop(stop: S.Stop | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def _top_k(value: int | None) -> int | None:
    return value if value is not None and value > 0 else None


def sampling_of(req: S.SamplingFields, *, max_tokens: int | None, logprobs: bool, top_logprobs: int) -> Sampling:
    return Sampling(
        n=req.n or 1,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=_top_k(req.top_k),
        min_p=req.min_p or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        logit_bias={int(k): v for k, v in req.logit_bias.items()} if req.logit_bias else None,
        seed=req.seed,
        max_tokens=max_tokens,
        min_tokens=req.min_tokens or 0,
        stop=_stop(req.stop),
        stop_token_ids=tuple(req.stop_token_ids or ()),
        include_stop_str_in_output=bool(req.include_stop_str_in_output),
        ignore_eos=bool(req.ignore_eos),
        skip_special_tokens=True if req.skip_special_tokens is None else req.skip_special_tokens,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
    )


def _builtins(value: Any) -> Any:
    return None if value is None else msgspec.to_builtins(value)


def _typed(item: dict[str, Any]) -> dict[str, Any]:
    """A tool, tool call or named tool choice with its `type` (a default the request structs leave
    out when encoding; chat templates and upstream servers such as llama-server expect it)."""
    return {"type": "function", **item}


def _typed_tool_calls(message: dict[str, Any]) -> dict[str, Any]:
    if message.get("tool_calls"):
        message["tool_calls"] = [_typed(call) for call in message["tool_calls"]]
    return message


def asked_max_tokens(req: S.ChatCompletionRequest) -> tuple[str, int | None]:
    """The output limit a chat request asks for and the field it came in: `max_completion_tokens`
    wins over `max_tokens`, which OpenAI deprecated for it."""
    if req.max_completion_tokens is not None:
        return "max_completion_tokens", req.max_completion_tokens
    return "max_tokens", req.max_tokens


def chat_spec(req: S.ChatCompletionRequest, *, request_id: str, upstream_model: str,
              limits: RouteLimits = RouteLimits()) -> RequestSpec:
    """The request spec, its `max_tokens` under the route's `limits`."""
    param, asked = asked_max_tokens(req)
    max_tokens = limits.max_tokens_for(req.model, param, asked)
    continue_final = bool(req.continue_final_message)
    add_generation_prompt = not continue_final if req.add_generation_prompt is None else req.add_generation_prompt
    tool_choice = req.tool_choice
    return RequestSpec(
        request_id=request_id,
        kind="chat",
        model=req.model,
        upstream_model=upstream_model,
        sampling=sampling_of(req, max_tokens=max_tokens, logprobs=bool(req.logprobs), top_logprobs=req.top_logprobs or 0),
        messages=[_typed_tool_calls(msgspec.to_builtins(m)) for m in req.messages],
        stream=bool(req.stream),
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        continuous_usage_stats=bool(req.stream_options and req.stream_options.continuous_usage_stats),
        priority=req.priority or 0,
        chat_template=req.chat_template,
        chat_template_kwargs=req.chat_template_kwargs,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final,
        tools=None if req.tools is None else [_typed(t) for t in msgspec.to_builtins(req.tools)],
        tool_choice=tool_choice if isinstance(tool_choice, str) or tool_choice is None else _typed(msgspec.to_builtins(tool_choice)),
        parallel_tool_calls=req.parallel_tool_calls,
        response_format=_builtins(req.response_format),
        structured_outputs=_builtins(req.structured_outputs),
        user=req.user,
        session=req.prompt_cache_key,
        extensions=extensions_used(req),
        max_tokens_asked=asked if asked != max_tokens else None,
    )


def completion_spec(req: S.CompletionRequest, *, request_id: str, upstream_model: str,
                    limits: RouteLimits = RouteLimits()) -> RequestSpec:
    """The request spec, its `max_tokens` under the route's `limits`."""
    max_tokens = limits.max_tokens_for(req.model, "max_tokens", req.max_tokens, COMPLETIONS_MAX_TOKENS)
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    logprobs = req.logprobs is not None
    return RequestSpec(
        request_id=request_id,
        kind="completion",
        model=req.model,
        upstream_model=upstream_model,
        sampling=sampling_of(req, max_tokens=max_tokens, logprobs=logprobs, top_logprobs=req.logprobs or 0),
        prompt=prompt,  # type: ignore[arg-type]
        stream=bool(req.stream),
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        continuous_usage_stats=bool(req.stream_options and req.stream_options.continuous_usage_stats),
        priority=req.priority or 0,
        echo=bool(req.echo),
        response_format=_builtins(req.response_format),
        structured_outputs=_builtins(req.structured_outputs),
        user=req.user,
        extensions=extensions_used(req),
        max_tokens_asked=req.max_tokens if req.max_tokens != max_tokens else None,
    )


_body_ids = itertools.count(1)
MAX_N = 128  # the most choices the schema allows; a backend's own limit is its capability


def spec_of_body(kind: Literal["chat", "completion"], model: str, body: dict[str, Any]) -> RequestSpec:
    """The RequestSpec a chat or completion JSON body (without `model`) becomes, through the same
    decoding and checks as a client's request: how the conformance battery builds its requests
    (`plugins.testing.specs.SpecBuilder`). `InvalidRequest` when the gateway would answer 400."""
    struct = S.ChatCompletionRequest if kind == "chat" else S.CompletionRequest
    request = msgspec.json.decode(msgspec.json.encode({"model": model, **body}), type=struct)
    request_id = f"plugin-check-{next(_body_ids)}"
    if isinstance(request, S.ChatCompletionRequest):
        check_chat(request, max_n=MAX_N)
        CHAT_FIELDS.screen(request, None)
        return chat_spec(request, request_id=request_id, upstream_model=model)
    check_completion(request, max_n=MAX_N)
    COMPLETIONS_FIELDS.screen(request, None)
    return completion_spec(request, request_id=request_id, upstream_model=model)
