"""The HTTP handlers of chat completions and legacy completions, served through the shared
machinery (`gateway.http.common.answer`) with this API's stream and response (`encode`). A
streamed chat request usually never reaches its handler: the streamed front answers it
(`streamed`), and hands it here only to be answered as Litestar answers errors."""

from __future__ import annotations

from litestar import Request, Response, post
from litestar.datastructures import State

from gateway.chat_api import schemas as S
from gateway.chat_api.encode import collect, open_stream
from gateway.chat_api.fields import COMPLETIONS_FIELDS
from gateway.chat_api.streamed import RAISE_IN_HANDLER, chat_request_spec
from gateway.chat_api.translate import check_completion, completion_spec
from gateway.http.common import answer, authorize, decode_body
from gateway.service.gateway import Gateway


@post("/v1/chat/completions", status_code=200, summary="Create a chat completion (OpenAI).")
async def chat_completions(request: Request, state: State) -> Response:
    if (error := request.scope.pop(RAISE_IN_HANDLER, None)) is not None:  # type: ignore[misc]
        raise error  # from `StreamedChatFront`, to be answered as every error is
    data = await decode_body(request, S.ChatCompletionRequest)
    gateway: Gateway = state.gateway
    spec = chat_request_spec(gateway, data, request.state.client_key, request.state.request_id)
    return await answer(request, gateway, spec, open_stream, collect)


@post("/v1/completions", status_code=200, summary="Create a text completion (OpenAI legacy).")
async def completions(request: Request, state: State) -> Response:
    data = await decode_body(request, S.CompletionRequest)
    gateway: Gateway = state.gateway
    authorize(request, data.model)
    check_completion(data, max_n=gateway.config.server.max_n)
    COMPLETIONS_FIELDS.screen(data, gateway.metrics.ignored_fields)
    spec = completion_spec(data, request_id=request.state.request_id, upstream_model="",
                           limits=gateway.limits_for(data.model))
    return await answer(request, gateway, spec, open_stream, collect)


HANDLERS = [chat_completions, completions]
