"""The published OpenAPI document (`/schema/openapi.json`), exact about what the gateway takes
and sends.

Litestar writes the paths and operations, but its schemas of msgspec structs lose facts the
gateway enforces (a `minimum` of 0 is dropped, unknown fields are not marked as refused, list
bounds inside unions vanish) and it knows nothing of the responses the handlers build by hand.
So the components are msgspec's own JSON Schema of the request and response structs — the
structs the gateway decodes with, vLLM's extensions included — and every operation lists its
real answers: the response object (or, for streams, one `data:` event: a chunk, an error object
or `[DONE]`) and the OpenAI error object for each error status it may answer with.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec
from litestar import Request
from litestar.openapi.plugins import JsonRenderPlugin

from gateway import messages_api
from gateway.chat_api import schemas as S
from gateway.embeddings_api import schemas as E
from gateway.errors import ErrorResponse
from gateway.messages_api import schemas as M
from gateway.model_cards import AnthropicModel, AnthropicModelList, CodexModelList
from gateway.http.fields import FieldTable
from gateway.responses_api import response_schemas as RO
from gateway.responses_api import schemas as R
from gateway.responses_api.fields import RESPONSES_FIELDS

REF = "#/components/schemas/{name}"
# Anthropic's structs are named as Anthropic names them (`Tool`, `ErrorResponse`...): in the
# document they carry this prefix, apart from OpenAI's of the same name
ANTHROPIC = "Anthropic"

# (path, method) -> media type -> the struct of a 200 body (for `text/event-stream`: of one event;
# a tuple: one of them, by what the client says it is)
SUCCESS: dict[tuple[str, str], dict[str, Any]] = {
    ("/v1/chat/completions", "post"): {"application/json": S.ChatCompletion, "text/event-stream": S.ChatCompletionChunk},
    ("/v1/completions", "post"): {"application/json": S.Completion, "text/event-stream": S.CompletionChunk},
    ("/v1/messages", "post"): {"application/json": M.MessageResponse, "text/event-stream": M.StreamEvent},
    ("/v1/messages/count_tokens", "post"): {"application/json": M.TokenCount},
    ("/v1/embeddings", "post"): {"application/json": E.EmbeddingsResponse},
    ("/v1/responses", "post"): {"application/json": RO.Response, "text/event-stream": RO.StreamEvent},
    ("/v1/responses/{response_id}", "get"): {"application/json": RO.Response},
    ("/v1/responses/{response_id}", "delete"): {"application/json": RO.DeletedResponse},
    ("/v1/responses/{response_id}/cancel", "post"): {"application/json": RO.Response},
    ("/v1/models", "get"): {"application/json": (S.ModelList, AnthropicModelList, CodexModelList)},
    ("/v1/models/{model_id}", "get"): {"application/json": (S.ModelCard, AnthropicModel)},
    ("/tokenize", "post"): {"application/json": S.TokenizeResponse},
    ("/detokenize", "post"): {"application/json": S.DetokenizeResponse},
    ("/switchyard/render", "post"): {"application/json": S.RenderResponse},
    ("/health", "get"): {"application/json": S.HealthStatus},
    ("/ready", "get"): {"application/json": S.HealthStatus},
    ("/metrics", "get"): {"text/plain": str},
}
# (path, method) -> the struct its JSON body is decoded into (strictly: see `gateway.app._body`)
REQUEST_BODIES: dict[tuple[str, str], type[msgspec.Struct]] = {
    ("/v1/chat/completions", "post"): S.ChatCompletionRequest,
    ("/v1/completions", "post"): S.CompletionRequest,
    ("/v1/messages", "post"): M.MessagesRequest,
    ("/v1/messages/count_tokens", "post"): M.CountTokensRequest,
    ("/v1/embeddings", "post"): E.EmbeddingsRequest,
    ("/v1/responses", "post"): R.ResponsesRequest,
    ("/tokenize", "post"): S.TokenizeBody,
    ("/detokenize", "post"): S.DetokenizeBody,
    ("/switchyard/render", "post"): S.RenderBody,
}
REQUESTS = tuple(REQUEST_BODIES.values())
# request fields decoded in two steps (the struct takes objects, each then converted strictly by
# its `type`): (struct, field) -> the structs its items are
ITEM_STRUCTS: dict[tuple[type[msgspec.Struct], str], tuple[type[msgspec.Struct], ...]] = {
    (R.ResponsesRequest, "input"): tuple(R.INPUT_ITEMS.values()),
}
# what each API's request struct refuses (`gateway.http.fields`): only null, in the document
FIELD_TABLES: tuple[FieldTable, ...] = (RESPONSES_FIELDS,)
# structs decoded only to be refused with a clear 400: no reference to them in the document
REFUSED_STRUCTS: tuple[type[msgspec.Struct], ...] = (*R.REFUSED_PARTS, *R.HOSTED_CHOICES)
# rules between fields of one request, as JSON Schema keywords on the request's schema
CROSS_FIELD: dict[type[msgspec.Struct], dict[str, Any]] = {
    R.ResponsesRequest: {  # `stream_options` only with `stream: true` (`translate.check_request`)
        "if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
        "then": {"required": ["stream"], "properties": {"stream": {"const": True}}},
    },
}

# every status an API operation may answer with besides 200, and why
ERRORS = {
    "400": "The request is malformed or asks for something the backend cannot do; `param` names the field.",
    "401": "No API key, or an unknown one.",
    "403": "The API key may not use this model.",
    "404": "Unknown model or route.",
    "405": "Method not allowed.",
    "413": "The body is larger than `server.max_body_bytes`.",
    "429": "The backend's queue is full, or the upstream rate-limits (`Retry-After`).",
    "500": "A bug (the message carries the request id) or an upstream 5xx.",
    "502": "The upstream is unreachable or answered with something that is not its protocol.",
    "503": "No backend available, or the server is shutting down.",
    "504": "The upstream sent nothing in time, or the request passed its deadline.",
}
OPEN_PATHS = {("/health", "get"), ("/metrics", "get")}  # no auth, no errors of their own


def _name(struct: Any) -> str:
    """A struct's name in the document."""
    return ANTHROPIC + struct.__name__ if struct.__module__ == M.__name__ else struct.__name__


def _anthropic_stream_event() -> dict[str, Any]:
    """One SSE event of a Messages stream: `event` names its type, `data` is the event as JSON."""
    names = [m.__struct_config__.tag for m in M.StreamEvent.__args__]
    payload = {"anyOf": [{"$ref": REF.format(name=_name(m))} for m in M.StreamEvent.__args__]}
    return {
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"type": "string", "enum": names},
            "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": payload},
        },
    }


def _stream_event(chunk: type) -> dict[str, Any]:
    """One SSE event: `data` is a chunk or an error object as JSON, or the final `[DONE]`."""
    payload = {"anyOf": [{"$ref": REF.format(name=chunk.__name__)}, {"$ref": REF.format(name="ErrorResponse")}]}
    return {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {
                "type": "string",
                "if": {"not": {"const": "[DONE]"}},
                "then": {"contentMediaType": "application/json", "contentSchema": payload},
            }
        },
    }


def _typed_stream_event() -> dict[str, Any]:
    """One event of a Responses stream: `event` names its `type`; `data` is the event as JSON."""
    members = [{"$ref": REF.format(name=t.__name__)} for t in RO.StreamEvent.__args__]  # type: ignore[attr-defined]
    return {
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"type": "string"},
            "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": {"anyOf": members}},
        },
    }


def components() -> dict[str, Any]:
    structs: list[Any] = [*REQUESTS, ErrorResponse, S.HealthStatus, S.ChatCompletionChunk, S.CompletionChunk, RO.StreamEvent,
                          M.ErrorResponse]
    bodies = [t for media in SUCCESS.values() for body in media.values() for t in (body if isinstance(body, tuple) else (body,))]
    structs += [t for t in bodies if isinstance(t, type) and issubclass(t, msgspec.Struct)]
    structs += list(M.StreamEvent.__args__)
    structs += [item for items in ITEM_STRUCTS.values() for item in items]
    structs = list(dict.fromkeys(structs))
    anthropic = [t for t in structs if t.__module__ == M.__name__]
    _, defs = msgspec.json.schema_components([t for t in structs if t not in anthropic], ref_template=REF)
    _, anthropic_defs = msgspec.json.schema_components(anthropic, ref_template=REF.format(name=ANTHROPIC + "{name}"))
    defs.update({ANTHROPIC + name: schema for name, schema in anthropic_defs.items()})
    for schema in defs.values():
        for prop in schema.get("properties", {}).values():
            _hoist_bounds(prop)
    _loosen_lone_tags(defs)
    _exact_requests(defs)
    return defs


def _exact_requests(defs: dict[str, Any]) -> None:
    """What the structs alone cannot say of the requests: the items of fields decoded in two
    steps (`ITEM_STRUCTS`), the fields each API refuses (`FIELD_TABLES`: null only), the
    structs decoded only to be refused (`REFUSED_STRUCTS`) and rules between fields (`CROSS_FIELD`)."""
    for (struct, field), items in ITEM_STRUCTS.items():
        prop = defs[_name(struct)]["properties"][field]
        for branch in prop.get("anyOf", [prop]):
            if branch.get("type") == "array":
                branch["items"] = {"anyOf": [{"$ref": REF.format(name=_name(item))} for item in items]}
    for table in FIELD_TABLES:
        props = defs[_name(table.struct)]["properties"]
        for field, why in table.refused.items():
            props[field] = {"type": "null", "description": f"Refused here: {why}."}
    refused = [{"$ref": REF.format(name=_name(struct))} for struct in REFUSED_STRUCTS]
    for schema in defs.values():
        _drop_branches(schema, refused)
    for struct, rules in CROSS_FIELD.items():
        defs[_name(struct)].update(copy.deepcopy(rules))


def _drop_branches(node: Any, refused: list[dict[str, str]]) -> None:
    """Removes the `refused` references from every `anyOf` (and its discriminator) under `node`."""
    if isinstance(node, dict):
        branches = node.get("anyOf")
        if isinstance(branches, list):
            node["anyOf"] = [b for b in branches if b not in refused]
        mapping = node.get("discriminator", {}).get("mapping")
        if isinstance(mapping, dict):
            refs = {r["$ref"] for r in refused}
            node["discriminator"]["mapping"] = {tag: ref for tag, ref in mapping.items() if ref not in refs}
        for value in node.values():
            _drop_branches(value, refused)
    elif isinstance(node, list):
        for value in node:
            _drop_branches(value, refused)


def _struct_named(name: str) -> type | None:
    if name.startswith(ANTHROPIC):
        cls = getattr(M, name[len(ANTHROPIC):], None)
    else:
        cls = getattr(S, name, None) or getattr(E, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, msgspec.Struct) else None


def _loosen_lone_tags(defs: dict[str, Any]) -> None:
    """msgspec requires a struct's tag (`"type": "text"`) only where it picks between the
    members of a union; a tagged struct standing alone (`content: str | list[TextPart]` of a
    system, developer or tool message) decodes without it. Say so: such places refer to a copy
    of the struct's schema (`<Name>Untagged`) in which the tag is optional."""
    for owner in list(defs):
        cls = _struct_named(owner)
        if cls is None:
            continue
        for field in msgspec.inspect.type_info(cls).fields:
            lone = _lone_tagged_items(field.type)
            if lone is None:
                continue
            name, tag_field = lone
            name = ANTHROPIC + name if owner.startswith(ANTHROPIC) else name
            loose = f"{name}Untagged"
            if loose not in defs:
                defs[loose] = copy.deepcopy(defs[name])
                defs[loose]["required"] = [r for r in defs[loose].get("required", []) if r != tag_field]
                defs[loose]["title"] = loose
            _replace_refs(defs[owner]["properties"][field.encode_name], REF.format(name=name), REF.format(name=loose))


def _lone_tagged_items(t: msgspec.inspect.Type) -> tuple[str, str] | None:
    """(struct name, tag field) when `t` has a list whose items are one tagged struct."""
    for member in t.types if isinstance(t, msgspec.inspect.UnionType) else (t,):
        if isinstance(member, msgspec.inspect.ListType) and isinstance(member.item_type, msgspec.inspect.StructType):
            item = member.item_type
            if item.tag_field is not None:
                return item.cls.__name__, item.tag_field
    return None


def _replace_refs(node: Any, target: str, replacement: str) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and value == target:
                node[key] = replacement
            else:
                _replace_refs(value, target, replacement)
    elif isinstance(node, list):
        for value in node:
            _replace_refs(value, target, replacement)


_NUMERIC_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "description")


def _hoist_bounds(prop: dict[str, Any]) -> None:
    """An optional number (`anyOf: [{type: number, maximum: 2}, {type: null}]`) also carries its
    bounds at the top, where readers of the schema (and Litestar's own output) look for them.
    The same keywords outside the `anyOf` mean the same: they constrain numbers only."""
    branches = prop.get("anyOf")
    if not isinstance(branches, list) or len(branches) != 2 or {"type": "null"} not in branches:
        return
    (value,) = [b for b in branches if b != {"type": "null"}]
    if value.get("type") in ("number", "integer"):
        for key in _NUMERIC_BOUNDS:
            if key in value:
                prop.setdefault(key, value[key])


def patch_document(document: dict[str, Any]) -> dict[str, Any]:
    """Litestar's document with exact components and every operation's real responses."""
    doc = copy.deepcopy(document)
    doc.setdefault("components", {})["schemas"] = components()
    doc["components"]["responses"] = {
        prefix + "Error" + status: {
            "description": why,
            "content": {"application/json": {"schema": {"$ref": REF.format(name=prefix + "ErrorResponse")}}},
        }
        for prefix in ("", ANTHROPIC)
        for status, why in ERRORS.items()
    }
    for path, item in doc.get("paths", {}).items():
        for method, operation in item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            operation["responses"] = _responses(path, method)
            body = REQUEST_BODIES.get((path, method))
            if body is not None:
                ref = {"$ref": REF.format(name=_name(body))}
                operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref}}}
    return doc


def _responses(path: str, method: str) -> dict[str, Any]:
    content: dict[str, Any] = {}
    for media, struct in SUCCESS.get((path, method), {"application/json": None}).items():
        if struct is str:
            content[media] = {"schema": {"type": "string"}}
        elif struct is None:
            content[media] = {"schema": {}}
        elif isinstance(struct, tuple):
            content[media] = {"schema": {"anyOf": [{"$ref": REF.format(name=_name(t))} for t in struct]}}
        elif struct is RO.StreamEvent:
            content[media] = {"schema": _typed_stream_event()}
        elif struct is M.StreamEvent:
            content[media] = {"schema": _anthropic_stream_event()}
        elif media == "text/event-stream":
            content[media] = {"schema": _stream_event(struct)}
        else:
            content[media] = {"schema": {"$ref": REF.format(name=_name(struct))}}
    responses: dict[str, Any] = {"200": {"description": "OK", "content": content}}
    if (path, method) in OPEN_PATHS:
        return responses
    if (path, method) == ("/ready", "get"):
        responses["503"] = {"description": "No backend is ready, or the server is draining.", "content": content}
        return responses
    prefix = ANTHROPIC if path.startswith(messages_api.PATH_PREFIX) else ""
    for status in ERRORS:
        responses[status] = {"$ref": f"#/components/responses/{prefix}Error{status}"}
    return responses


class SchemaPlugin(JsonRenderPlugin):
    """Serves the patched document as JSON at `/schema/openapi.json` (and `/schema`)."""

    def __init__(self) -> None:
        super().__init__(path=["/openapi.json", "/"])
        self._rendered: bytes | None = None

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        if self._rendered is None:
            self._rendered = self.render_json(request, patch_document(openapi_schema))
        return self._rendered
