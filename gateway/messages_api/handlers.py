"""The HTTP handlers of the Messages API, served through the shared machinery
(`gateway.service.attempts`, `gateway.http.common`) with its own stream writer and sink (`encode`)."""

from __future__ import annotations

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State

from gateway.http.common import answer, authorize, decode_body, resolve_for_tokens, response_headers
from gateway.messages_api import schemas as M
from gateway.messages_api.encode import MessageSink, MessageStream
from gateway.messages_api.fields import COUNT_TOKENS_FIELDS, MESSAGES_FIELDS
from gateway.messages_api.translate import count_tokens_request, messages_spec
from gateway.service.accounting import RequestAccounting
from gateway.service.admission import check_messages
from gateway.service.attempts import Answer, collect_events, open_events, stream_body
from gateway.service.gateway import Gateway
from plugins.contract.protocol import RequestSpec


async def open_stream(gateway: Gateway, spec: RequestSpec, accounting: RequestAccounting | None) -> Answer:
    opened = await open_events(gateway, spec, accounting=accounting)
    return Answer(body=stream_body(opened, MessageStream(spec)), backend=opened.backend)


async def collect(gateway: Gateway, spec: RequestSpec, accounting: RequestAccounting | None) -> Answer:
    sink, usage, backend = await collect_events(gateway, spec, MessageSink, accounting=accounting)
    return Answer(body=sink.message(spec, usage), backend=backend)


@post("/v1/messages", status_code=200, summary="Create a message (Anthropic Messages API).")
async def create_message(request: Request, state: State) -> Response:
    data = await decode_body(request, M.MessagesRequest)
    gateway: Gateway = state.gateway
    authorize(request, data.model)
    check_messages(len(data.messages), gateway.config.server.max_messages)
    MESSAGES_FIELDS.screen(data, gateway.metrics.ignored_fields)
    spec = messages_spec(data, request_id=request.state.request_id, limits=gateway.limits_for(data.model))
    return await answer(request, gateway, spec, open_stream, collect)


@post("/v1/messages/count_tokens", status_code=200, summary="Count a message's input tokens (Anthropic Messages API).")
async def count_tokens(request: Request, state: State) -> Response:
    data = await decode_body(request, M.CountTokensRequest)
    gateway: Gateway = state.gateway
    check_messages(len(data.messages), gateway.config.server.max_messages)
    COUNT_TOKENS_FIELDS.screen(data, gateway.metrics.ignored_fields)
    resolved = resolve_for_tokens(request, gateway, data.model)
    result = await resolved.backend.tokenize(count_tokens_request(data, upstream_model=resolved.target.model))
    body = msgspec.json.encode(M.TokenCount(input_tokens=len(result.tokens)))
    return Response(content=body, media_type="application/json", headers=response_headers(request, resolved.backend.name))


HANDLERS = [create_message, count_tokens]
