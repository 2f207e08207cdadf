"""The Litestar app: routes, the lifespan that owns the backends, auth and request ids."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.config.app import AppConfig
from litestar.datastructures import ResponseHeader, State
from litestar.exceptions import ValidationException
from litestar.openapi import OpenAPIConfig

from gateway.chat_api import handlers as chat_api
from gateway.chat_api import schemas as S
from gateway.chat_api.streamed import RAISE_IN_HANDLER
from gateway.config import Config
from gateway.embeddings_api import handlers as embeddings_api
from gateway.error_handlers import EXCEPTION_HANDLERS, handle_switchyard_error
from gateway.errors import ShuttingDown, from_decode_error
from gateway.http.common import authorize, decode_body, resolve_for_tokens, response_headers
from gateway.ids import request_id_from
from gateway.keys.keyring import KeyRing, authorization_of
from gateway.keys.usage import keys_usage
from gateway.messages_api import handlers as messages_api
from gateway.model_cards import get_model, list_models
from gateway.openapi import SchemaPlugin
from gateway.responses_api import handlers as responses_api
from gateway.service.admission import check_messages
from gateway.service.gateway import Gateway
from plugins.contract.errors import AuthenticationFailed, InvalidRequest
from plugins.contract.protocol import TokenizeRequest

log = logging.getLogger("switchyard.gateway")

PUBLIC_PATHS = frozenset({"/health", "/ready", "/metrics", *messages_api.PROBE_PATHS})


def _gateway(state: State) -> Gateway:
    return state.gateway


async def _before_request(request: Request) -> Response | None:
    if RAISE_IN_HANDLER in request.scope:  # a streamed chat request begun in front (its id and key stand)
        return None
    request.state.request_id = request_id_from(request.headers)
    request.state.client_key = None
    path = request.url.path
    public = path in PUBLIC_PATHS or path.startswith("/schema")
    gateway: Gateway | None = getattr(request.app.state, "gateway", None)
    if gateway is not None and gateway.draining and not public:
        return handle_switchyard_error(request, ShuttingDown())
    keyring: KeyRing = request.app.state.keyring
    if keyring.enabled and not public:
        key = keyring.authenticate(authorization_of(request.headers))
        if key is None:
            return handle_switchyard_error(request, AuthenticationFailed("Invalid or missing API key.", code="invalid_api_key"))
        request.state.client_key = key
    return None


def _validation_error(request: Request, exc: ValidationException) -> Response:
    """Litestar's own parameter validation (path and query parameters; bodies are `_body`'s)."""
    cause = exc.__cause__
    if isinstance(cause, msgspec.ValidationError):
        text = str(cause).replace("`$.data.", "`$.").replace("`$.data`", "`$`")
        error = from_decode_error(msgspec.ValidationError(text))
    else:
        error = InvalidRequest(str(exc.detail))
    return handle_switchyard_error(request, error)


@post("/tokenize", status_code=200, summary="Tokenize a prompt or chat messages (vLLM's shape).")
async def tokenize(request: Request, state: State) -> Response:
    data = await decode_body(request, S.TokenizeBody)
    gateway = _gateway(state)
    if (data.prompt is None) == (data.messages is None):
        raise InvalidRequest("Send exactly one of `prompt` and `messages`.", param="prompt")
    if data.messages is not None:
        check_messages(len(data.messages), gateway.config.server.max_messages)
    resolved = resolve_for_tokens(request, gateway, data.model)
    chat = data.messages is not None
    result = await resolved.backend.tokenize(
        TokenizeRequest(
            upstream_model=resolved.target.model,
            prompt=data.prompt,
            messages=[msgspec.to_builtins(m) for m in data.messages] if chat else None,
            add_special_tokens=(not chat) if data.add_special_tokens is None else data.add_special_tokens,
            add_generation_prompt=True if data.add_generation_prompt is None else data.add_generation_prompt,
            continue_final_message=bool(data.continue_final_message),
            chat_template=data.chat_template,
            chat_template_kwargs=data.chat_template_kwargs,
            tools=msgspec.to_builtins(data.tools) if data.tools else None,
            return_token_strs=bool(data.return_token_strs),
        )
    )
    body = S.TokenizeResponse(count=len(result.tokens), max_model_len=result.max_model_len, tokens=result.tokens, token_strs=result.token_strs)
    return Response(content=msgspec.json.encode(body), media_type="application/json", headers=response_headers(request, resolved.backend.name))


@post("/detokenize", status_code=200, summary="Detokenize token ids (vLLM's shape).")
async def detokenize(request: Request, state: State) -> Response:
    data = await decode_body(request, S.DetokenizeBody)
    gateway = _gateway(state)
    resolved = resolve_for_tokens(request, gateway, data.model)
    text = await resolved.backend.detokenize(resolved.target.model, data.tokens)
    body = S.DetokenizeResponse(prompt=text)
    return Response(content=msgspec.json.encode(body), media_type="application/json", headers=response_headers(request, resolved.backend.name))


@post("/switchyard/render", status_code=200, summary="Show the prompt text and token ids a backend builds for a conversation.")
async def render(request: Request, state: State) -> Response:
    """The template inspector: with `compare`, every target of the route side by side, and the
    index of the first token where they differ."""
    data = await decode_body(request, S.RenderBody)
    gateway = _gateway(state)
    check_messages(len(data.messages), gateway.config.server.max_messages)
    if data.compare:
        authorize(request, data.model)
        route, _ = gateway.model_card(data.model)
        targets = [(gateway.backends[t.backend], t.model) for t in route.targets]
    else:
        resolved = resolve_for_tokens(request, gateway, data.model)
        targets = [(resolved.backend, resolved.target.model)]
    messages = [msgspec.to_builtins(m) for m in data.messages]
    tools = msgspec.to_builtins(data.tools) if data.tools else None
    add_generation_prompt = True if data.add_generation_prompt is None else data.add_generation_prompt
    renders = []
    for backend, model in targets:
        rendered = await backend.render(
            model, messages, add_generation_prompt=add_generation_prompt, chat_template_kwargs=data.chat_template_kwargs, tools=tools
        )
        renders.append(
            S.RenderedPrompt(backend=backend.name, model=model, text=rendered.text, tokens=rendered.tokens, token_strs=rendered.token_strs)
        )
    body = S.RenderResponse(model=data.model, renders=renders, first_difference=first_difference([r.tokens for r in renders]))
    return Response(content=msgspec.json.encode(body), media_type="application/json", headers=response_headers(request))


def first_difference(token_lists: list[list[int]]) -> int | None:
    """The first position where the lists disagree (a shorter list ends there); None if equal."""
    if len(token_lists) < 2:
        return None
    longest = max(len(t) for t in token_lists)
    for i in range(longest):
        if len({t[i] if i < len(t) else None for t in token_lists}) > 1:
            return i
    return None


@get("/health", summary="Liveness: the gateway process answers.")
async def health() -> Response:
    return Response(content=b'{"status":"ok"}', media_type="application/json")


@get("/ready", summary="Readiness: at least one backend is healthy.")
async def ready(state: State) -> Response:
    gateway = _gateway(state)
    if not gateway.draining and await gateway.ready():
        return Response(content=b'{"status":"ready"}', media_type="application/json")
    return Response(content=b'{"status":"unavailable"}', status_code=503, media_type="application/json")


@get("/metrics", summary="Prometheus metrics.")
async def metrics(state: State) -> Response:
    return Response(content=_gateway(state).metrics.render(), media_type="text/plain; version=0.0.4")  # Litestar appends "; charset=utf-8"


def create_app(config: Config, gateway: Gateway | None = None, *, worker: int | None = None) -> Litestar:
    """The app for `config`; the lifespan builds the backends from it (or uses `gateway`). In a
    server with several worker processes (`gateway.worker_pool`), `worker` is this one's number,
    sent in the `x-switchyard-worker` header of every answer."""

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        gw = gateway or Gateway.from_config(config)
        app.state.gateway = gw
        try:
            await gw.start()
            yield
        finally:
            await gw.close()

    def on_app_init(app_config: AppConfig) -> AppConfig:
        app_config.state = State({"keyring": KeyRing.from_config(config.server)})
        return app_config

    return Litestar(
        route_handlers=[*chat_api.HANDLERS, *responses_api.HANDLERS, *messages_api.HANDLERS,
                        *embeddings_api.HANDLERS, list_models, get_model, tokenize, detokenize,
                        render, health, ready, metrics, keys_usage],
        lifespan=[lifespan, responses_api.lifespan(config.responses)],
        before_request=_before_request,
        exception_handlers={**EXCEPTION_HANDLERS, ValidationException: _validation_error},
        openapi_config=OpenAPIConfig(title="Switchyard", version="0.1.0", path="/schema", render_plugins=[SchemaPlugin()]),
        request_max_body_size=config.server.max_body_bytes,
        response_headers=[ResponseHeader(name="x-switchyard-worker", value=str(worker))] if worker is not None else None,
        on_app_init=[on_app_init],
        logging_config=None,
    )
