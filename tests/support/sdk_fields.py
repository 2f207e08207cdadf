"""Every top-level request field the pinned official SDKs (openai, anthropic; pyproject's test
extra) can send, per API, read from the SDKs themselves (issue #32: each field must be classified
by the front-end as acted on, accepted and ignored, or refused with a reason).

Two readings of each SDK, which a test keeps in agreement:

- `typeddict_fields`: the keys of the request TypedDicts (`CompletionCreateParamsBase` and its
  streaming variants...), with whether each is `Required[...]`, across bases and `total=False`.
  Read with `typing.get_type_hints(include_extras=True)`: the SDKs annotate lazily, so
  `__required_keys__` is empty and cannot be trusted.
- `body_fields`: the keys of the `body={...}` dict the resource method posts (read from its
  source with `ast`). A TypedDict key that is not among them goes elsewhere: a header
  (`betas` -> `anthropic-beta`), the query (`beta=true`) or nowhere.

    python -m tests.support.sdk_fields            # the inventory, and what the gateway's structs take

`GATEWAY_STRUCTS` names the gateway's request struct per API by dotted path, so the comparison
follows the structs when they move.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import textwrap
import typing
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any


@dataclass(frozen=True)
class SDKRequest:
    """One API's request as an SDK sends it."""

    api: str  # "openai.chat.completions", "anthropic.beta.messages", ...
    sdk: str  # "openai" | "anthropic"
    path: str  # where the SDK posts it
    typeddicts: tuple[str, ...]  # dotted names, the base first
    method: str  # the resource method, as an attribute path of a client: "chat.completions.create"


SDK_REQUESTS = (
    SDKRequest("openai.chat.completions", "openai", "/chat/completions",
               ("openai.types.chat.completion_create_params.CompletionCreateParamsBase",
                "openai.types.chat.completion_create_params.CompletionCreateParamsNonStreaming",
                "openai.types.chat.completion_create_params.CompletionCreateParamsStreaming"),
               "chat.completions.create"),
    SDKRequest("openai.completions", "openai", "/completions",
               ("openai.types.completion_create_params.CompletionCreateParamsBase",
                "openai.types.completion_create_params.CompletionCreateParamsNonStreaming",
                "openai.types.completion_create_params.CompletionCreateParamsStreaming"),
               "completions.create"),
    SDKRequest("openai.responses", "openai", "/responses",
               ("openai.types.responses.response_create_params.ResponseCreateParamsBase",
                "openai.types.responses.response_create_params.ResponseCreateParamsNonStreaming",
                "openai.types.responses.response_create_params.ResponseCreateParamsStreaming"),
               "responses.create"),
    SDKRequest("openai.embeddings", "openai", "/embeddings",
               ("openai.types.embedding_create_params.EmbeddingCreateParams",), "embeddings.create"),
    SDKRequest("anthropic.messages", "anthropic", "/v1/messages",
               ("anthropic.types.message_create_params.MessageCreateParamsBase",
                "anthropic.types.message_create_params.MessageCreateParamsNonStreaming",
                "anthropic.types.message_create_params.MessageCreateParamsStreaming"),
               "messages.create"),
    SDKRequest("anthropic.beta.messages", "anthropic", "/v1/messages?beta=true",
               ("anthropic.types.beta.message_create_params.MessageCreateParamsBase",
                "anthropic.types.beta.message_create_params.MessageCreateParamsNonStreaming",
                "anthropic.types.beta.message_create_params.MessageCreateParamsStreaming"),
               "beta.messages.create"),
    SDKRequest("anthropic.messages.count_tokens", "anthropic", "/v1/messages/count_tokens",
               ("anthropic.types.message_count_tokens_params.MessageCountTokensParams",), "messages.count_tokens"),
    SDKRequest("anthropic.beta.messages.count_tokens", "anthropic", "/v1/messages/count_tokens?beta=true",
               ("anthropic.types.beta.message_count_tokens_params.MessageCountTokensParams",),
               "beta.messages.count_tokens"),
)

# The gateway's request struct that decodes each API's body (dotted path; None: not served).
# Claude Code calls the beta endpoint (`?beta=true`) and Codex the Responses API.
GATEWAY_STRUCTS: dict[str, str | None] = {
    "openai.chat.completions": "gateway.chat_api.schemas.ChatCompletionRequest",
    "openai.completions": "gateway.chat_api.schemas.CompletionRequest",
    "openai.responses": "gateway.responses_api.schemas.ResponsesRequest",
    "openai.embeddings": "gateway.embeddings_api.schemas.EmbeddingsRequest",
    "anthropic.messages": "gateway.messages_api.schemas.MessagesRequest",
    "anthropic.beta.messages": "gateway.messages_api.schemas.MessagesRequest",
    "anthropic.messages.count_tokens": "gateway.messages_api.schemas.CountTokensRequest",
    "anthropic.beta.messages.count_tokens": "gateway.messages_api.schemas.CountTokensRequest",
}


def _resolve(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def sdk_version(sdk: str) -> str:
    return importlib.metadata.version(sdk)


def typeddict_fields(typeddict: type) -> dict[str, bool]:
    """Field name -> required, over the TypedDict and its bases. `__required_keys__` carries each
    declaring class's `total`, but misses `Required[...]` / `NotRequired[...]` written in lazy
    annotations; `get_type_hints(include_extras=True)` sees those."""
    out = {}
    for name, hint in typing.get_type_hints(typeddict, include_extras=True).items():
        origin = typing.get_origin(hint)
        required = origin is typing.Required or name in typeddict.__required_keys__
        out[name] = required and origin is not typing.NotRequired
    return out


def _client(sdk: str) -> Any:
    module = importlib.import_module(sdk)
    client_class = module.OpenAI if sdk == "openai" else module.Anthropic
    return client_class(api_key="unused", base_url="http://127.0.0.1:9")


def _method(request: SDKRequest) -> Callable[..., Any]:
    target: Any = _client(request.sdk)
    for attr in request.method.split("."):
        target = getattr(target, attr)
    return target


def body_fields(method: Callable[..., Any]) -> set[str] | None:
    """The keys of the dict literal the method posts as `body=` (through `maybe_transform(...)`),
    or None when the body is not a literal there (embeddings builds it elsewhere)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(method))))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_post":
            for keyword in node.keywords:
                if keyword.arg == "body":
                    value = keyword.value
                    while isinstance(value, ast.Call) and value.args:
                        value = value.args[0]
                    if isinstance(value, ast.Dict):
                        return {key.value for key in value.keys if isinstance(key, ast.Constant)}
    return None


def method_params(method: Callable[..., Any]) -> set[str]:
    """The method's keyword parameters less the SDK's request options."""
    skip = {"extra_headers", "extra_query", "extra_body", "timeout", "self"}
    return set(inspect.signature(method).parameters) - skip


@dataclass(frozen=True)
class RequestFields:
    api: str
    sdk: str  # "openai 3.57.0"
    path: str
    fields: dict[str, bool]  # every TypedDict key -> required
    body: frozenset[str]  # those the SDK puts in the JSON body
    elsewhere: frozenset[str]  # those it sends as headers / query, not in the body
    method_only: frozenset[str]  # method parameters missing from the TypedDicts


@cache
def inventory() -> tuple[RequestFields, ...]:
    out = []
    for request in SDK_REQUESTS:
        fields: dict[str, bool] = {}  # required: in every TypedDict that has it (`stream` is not)
        for dotted in request.typeddicts:
            for name, required in typeddict_fields(_resolve(dotted)).items():
                fields[name] = fields.get(name, True) and required
        method = _method(request)
        body = body_fields(method)
        body = set(fields) if body is None else body
        out.append(RequestFields(
            api=request.api, sdk=f"{request.sdk} {sdk_version(request.sdk)}", path=request.path, fields=fields,
            body=frozenset(body), elsewhere=frozenset(set(fields) - body),
            method_only=frozenset(method_params(method) - set(fields)),
        ))
    return tuple(out)


def struct_fields(struct: type) -> set[str]:
    """The wire names a msgspec struct decodes (its `encode_name`s)."""
    import msgspec

    return {field.encode_name for field in msgspec.structs.fields(struct)}


def main() -> None:
    for entry in inventory():
        gateway = GATEWAY_STRUCTS.get(entry.api)
        try:
            accepted = struct_fields(_resolve(gateway)) if gateway else set()
        except (ImportError, AttributeError):
            gateway, accepted = f"{gateway} (not found)", set()
        print(f"## {entry.api} ({entry.sdk}, POST {entry.path}) -> {gateway}")
        body = sorted(entry.body)
        print(f"body fields ({len(body)}): {', '.join(n + ('*' if entry.fields.get(n) else '') for n in body)}")
        if entry.elsewhere:
            print(f"not in the body (headers/query): {', '.join(sorted(entry.elsewhere))}")
        if entry.method_only:
            print(f"method parameters missing from the TypedDicts: {', '.join(sorted(entry.method_only))}")
        taken = sorted(accepted & entry.body)
        print(f"accepted by the gateway today ({len(taken)}): {', '.join(taken)}")
        print(f"not accepted today ({len(entry.body - accepted)}): {', '.join(sorted(entry.body - accepted))}")
        extra = sorted(accepted - entry.body)
        if extra:
            print(f"gateway-only (not in this SDK's body): {', '.join(extra)}")
        print()


if __name__ == "__main__":
    main()
