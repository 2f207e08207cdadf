"""The HTTP handlers of the Messages API, served through the shared machinery
(`gateway.service.attempts`, `gateway.http.common`) with its own stream writer and sink (`encode`).
`?beta=true` (the official clients' beta API, Claude Code's only API) reaches the same handlers
(the query changes nothing). Anthropic's clients' probes are answered too: `GET` / `HEAD` of `/`
(a connectivity check) and of `/api/hello` (Claude Code's, unless
`CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC` is set; it ignores the answer), with no key needed."""

from __future__ import annotations

from functools import partial
from typing import Annotated

import msgspec
from litestar import Request, Response, get, head, post
from litestar.datastructures import State
from litestar.params import QueryParameter

from gateway.http.billing_header import strip_billing_lines
from gateway.http.common import answer, authorize, decode_body, resolve_for_tokens, response_headers
from gateway.messages_api import schemas as M
from gateway.messages_api.encode import MessageSink, MessageStream
from gateway.messages_api.errors import in_anthropic_words
from gateway.messages_api.fields import COUNT_TOKENS_FIELDS, MESSAGES_FIELDS
from gateway.messages_api.translate import count_tokens_request, messages_spec, omits_thinking
from gateway.service.accounting import RequestAccounting
from gateway.service.admission import check_messages
from gateway.service.attempts import Answer, collect_events, open_events, stream_body
from gateway.service.gateway import Gateway
from plugins.contract.errors import ContextLengthExceeded
from plugins.contract.protocol import RequestSpec

PROBE_PATHS = ("/", "/api/hello")  # answered without a key, as /health is


async def open_stream(gateway: Gateway, spec: RequestSpec, accounting: RequestAccounting | None, *,
                      omit_thinking: bool = False) -> Answer:
    opened = await open_events(gateway, spec, accounting=accounting)
    return Answer(body=stream_body(opened, MessageStream(spec, omit_thinking=omit_thinking)), backend=opened.backend)


async def collect(gateway: Gateway, spec: RequestSpec, accounting: RequestAccounting | None, *,
                  omit_thinking: bool = False) -> Answer:
    new_sink = partial(MessageSink, omit_thinking=omit_thinking)
    sink, usage, backend = await collect_events(gateway, spec, new_sink, accounting=accounting)
    return Answer(body=sink.message(spec, usage), backend=backend)


BETA = QueryParameter(required=False, description="The official clients' beta API (`true`); the same "
                 "fields are taken with or without it.")


@post("/v1/messages", status_code=200, summary="Create a message (Anthropic Messages API).")
async def create_message(request: Request, state: State, beta: Annotated[bool, BETA] = False) -> Response:
    data = await decode_body(request, M.MessagesRequest)
    gateway: Gateway = state.gateway
    authorize(request, data.model)
    check_messages(len(data.messages), gateway.config.server.max_messages)
    MESSAGES_FIELDS.screen(data, gateway.metrics.ignored_fields)
    spec = messages_spec(data, request_id=request.state.request_id, limits=gateway.limits_for(data.model))
    omit = omits_thinking(data)
    try:
        return await answer(request, gateway, spec, partial(open_stream, omit_thinking=omit),
                            partial(collect, omit_thinking=omit))
    except ContextLengthExceeded as exc:
        raise in_anthropic_words(exc, spec.sampling.max_tokens) from exc


@post("/v1/messages/count_tokens", status_code=200, summary="Count a message's input tokens (Anthropic Messages API).")
async def count_tokens(request: Request, state: State, beta: Annotated[bool, BETA] = False) -> Response:
    data = await decode_body(request, M.CountTokensRequest)
    gateway: Gateway = state.gateway
    check_messages(len(data.messages), gateway.config.server.max_messages)
    COUNT_TOKENS_FIELDS.screen(data, gateway.metrics.ignored_fields)
    resolved = resolve_for_tokens(request, gateway, data.model)
    tokenize = count_tokens_request(data, upstream_model=resolved.target.model)
    if gateway.strips_billing_header(data.model):  # as create_message's prompt is rendered
        tokenize = msgspec.structs.replace(tokenize, messages=strip_billing_lines(tokenize.messages) or tokenize.messages)
    result = await resolved.backend.tokenize(tokenize)
    body = msgspec.json.encode(M.TokenCount(input_tokens=len(result.tokens)))
    return Response(content=body, media_type="application/json", headers=response_headers(request, resolved.backend.name))


@get(list(PROBE_PATHS), summary="Connectivity probe of Anthropic's clients: 200.", include_in_schema=False)
async def probe() -> Response:
    return Response(content=b'{"status":"ok"}', media_type="application/json")


@head(list(PROBE_PATHS), summary="Connectivity probe of Anthropic's clients (Claude Code's `HEAD /api/hello`): 200.",
      include_in_schema=False)
async def probe_head() -> None:
    return None


HANDLERS = [create_message, count_tokens, probe, probe_head]
