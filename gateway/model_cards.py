"""`GET /v1/models` and `GET /v1/models/{id}`: the routes (not their globs), in the shape of the
client that asks:

- OpenAI's list (`{"object": "list", "data": [{"id", "object", "created", "owned_by",
  "max_model_len"}]}`), vLLM's `max_model_len` included;
- Anthropic's, to a request carrying `anthropic-version` (the `anthropic` SDK, Claude Code):
  `{"data": [{"type": "model", "id", "display_name", "created_at"}], "has_more", "first_id",
  "last_id"}`, paged by `limit` / `after_id` / `before_id`;
- Codex's model catalog, to a request carrying `client_version` (Codex's model discovery,
  `GET {base_url}/models?client_version=...`): `{"models": [{"slug", "context_window", ...}]}`,
  each model described as Codex describes a model it does not know, with the route's context
  window, so Codex compacts before the context is full. A saved copy serves as Codex's
  `model_catalog_json`.
"""

from __future__ import annotations

import datetime
from typing import Any, Literal

import msgspec
from litestar import Request, Response, get
from litestar.datastructures import State
from litestar.params import FromPath

from gateway.chat_api import schemas as S
from gateway.http.common import authorize, response_headers
from gateway.keys.keyring import ClientKey
from gateway.service.gateway import Gateway
from gateway.service.model_names import is_glob
from plugins.contract.errors import InvalidRequest

ANTHROPIC_PAGE = 20  # Anthropic's default `limit`
ANTHROPIC_MAX_PAGE = 1000


class AnthropicModel(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    id: str
    display_name: str
    created_at: str  # RFC 3339
    type: Literal["model"] = "model"


class AnthropicModelList(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    data: list[AnthropicModel]
    has_more: bool
    first_id: str | None
    last_id: str | None


class CodexTruncation(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    mode: Literal["bytes", "tokens"] = "bytes"
    limit: int = 10_000


class CodexModel(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One model as Codex's `/models` describes it (`codex_protocol::openai_models::ModelInfo`),
    with the values Codex itself gives a model it does not know (`model_info_from_slug`), but the
    context window."""

    slug: str
    display_name: str
    description: str | None = None
    base_instructions: str = ""  # Codex refuses a model without instructions
    context_window: int | None = None
    max_context_window: int | None = None
    auto_compact_token_limit: int | None = None  # None: Codex compacts at 90% of the window
    effective_context_window_percent: int = 95
    default_reasoning_level: str | None = None
    supported_reasoning_levels: list[dict[str, str]] = []
    shell_type: str = "default"
    visibility: str = "list"
    supported_in_api: bool = True
    priority: int = 99
    upgrade: None = None
    supports_reasoning_summaries: bool = False
    default_reasoning_summary: str = "auto"
    support_verbosity: bool = False
    default_verbosity: str | None = None
    apply_patch_tool_type: str | None = None
    web_search_tool_type: str = "text"
    truncation_policy: CodexTruncation = msgspec.field(default_factory=CodexTruncation)
    supports_parallel_tool_calls: bool = False
    supports_image_detail_original: bool = False
    experimental_supported_tools: list[str] = []
    input_modalities: list[str] = msgspec.field(default_factory=lambda: ["text"])
    supports_search_tool: bool = False
    use_responses_lite: bool = False


class CodexModelList(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    models: list[CodexModel]


def _gateway(state: State) -> Gateway:
    return state.gateway


def listed(gateway: Gateway, key: ClientKey | None) -> list[str]:
    """The route names `/v1/models` shows this key: every route but the glob-named ones."""
    return [name for name in gateway.routes if not is_glob(name) and (key is None or key.may_use(name))]


@get("/v1/models", summary="List the models this gateway serves (OpenAI's, Anthropic's or Codex's shape).")
async def list_models(request: Request, state: State) -> Response:
    gateway = _gateway(state)
    names = listed(gateway, request.state.client_key)
    if "client_version" in request.query_params:
        body: msgspec.Struct = CodexModelList(models=[codex_card(gateway, name) for name in names])
    elif "anthropic-version" in request.headers:
        body = anthropic_page(gateway, names, request.query_params)
    else:
        body = S.ModelList(data=[openai_card(gateway, name) for name in names])
    return Response(content=msgspec.json.encode(body), media_type="application/json", headers=response_headers(request))


@get("/v1/models/{model_id:path}", summary="Describe one model (a route, an alias or a name a glob matches).")
async def get_model(request: Request, state: State, model_id: FromPath[str]) -> Response:
    name = model_id.lstrip("/")
    authorize(request, name)
    gateway = _gateway(state)
    card: msgspec.Struct = anthropic_card(gateway, name) if "anthropic-version" in request.headers else openai_card(gateway, name)
    return Response(content=msgspec.json.encode(card), media_type="application/json", headers=response_headers(request))


def openai_card(gateway: Gateway, name: str) -> S.ModelCard:
    route, max_model_len = gateway.model_card(name)
    owner = gateway.backends[route.targets[0].backend].name if len(route.targets) == 1 else "switchyard"
    return S.ModelCard(id=name, created=gateway.created, owned_by=owner, max_model_len=max_model_len)


def anthropic_card(gateway: Gateway, name: str) -> AnthropicModel:
    gateway.model_card(name)  # 404 for a name no route answers to
    created = datetime.datetime.fromtimestamp(gateway.created, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return AnthropicModel(id=name, display_name=name, created_at=created)


# Codex's system prompt for a catalogued model (it insists on one): short, since the models a
# gateway like this serves often have small contexts; `model_instructions_file` in Codex's own
# config replaces it.
CODEX_INSTRUCTIONS = ("You are a coding agent working in the user's terminal and workspace. Use the tools you are "
                      "given to inspect files and run commands, make the changes asked for, and answer briefly.")


def codex_card(gateway: Gateway, name: str) -> CodexModel:
    _, max_model_len = gateway.model_card(name)
    return CodexModel(slug=name, display_name=name, description=f"{name}, served by Switchyard",
                      base_instructions=CODEX_INSTRUCTIONS, context_window=max_model_len, max_context_window=max_model_len)


def anthropic_page(gateway: Gateway, names: list[str], query: Any) -> AnthropicModelList:
    """Anthropic's paging: `limit` (1–1000, default 20) names after `after_id` or before `before_id`."""
    try:
        limit = int(query.get("limit", ANTHROPIC_PAGE))
    except ValueError:
        raise InvalidRequest("`limit` must be an integer.", param="limit") from None
    if not 1 <= limit <= ANTHROPIC_MAX_PAGE:
        raise InvalidRequest(f"`limit` must be between 1 and {ANTHROPIC_MAX_PAGE}.", param="limit")
    start, end = 0, len(names)
    for param in ("after_id", "before_id"):
        value = query.get(param)
        if value is not None and value not in names:
            raise InvalidRequest(f"`{param}` {value!r} is not a listed model.", param=param)
    if (after := query.get("after_id")) is not None:
        start = names.index(after) + 1
    if (before := query.get("before_id")) is not None:
        end = names.index(before)
        start = max(start, end - limit) if after is None else start
    page = names[start:end][:limit]
    data = [anthropic_card(gateway, name) for name in page]
    more = start + len(page) < end if before is None else start > 0
    return AnthropicModelList(data=data, has_more=more, first_id=page[0] if page else None,
                              last_id=page[-1] if page else None)
