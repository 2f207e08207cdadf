"""The handler of OpenAI's embeddings API (`POST /v1/embeddings`) and the serving of one request
across its attempts; its structs are `schemas`, the request's checks `translate`, the response
`encode`.

An embeddings request is routed like a generation (routes, breakers, fallback before anything
came back, backend queues, the deadline, metrics and the request log, under kind "embedding")
and then handed to the backend's `embed()` whole; a backend without it is a 400 naming it.
"""

from __future__ import annotations

import asyncio

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State

from gateway.embeddings_api.encode import response
from gateway.embeddings_api.fields import EMBEDDINGS_FIELDS
from gateway.embeddings_api.schemas import EmbeddingsRequest
from gateway.embeddings_api.translate import cost_of, inputs_of, routing_spec
from gateway.http.common import (
    CLIENT_CLOSED_REQUEST,
    accounted,
    authorize,
    client_request,
    decode_body,
    response_headers,
)
from gateway.service.accounting import RequestAccounting
from gateway.service.attempts import Observed
from gateway.service.gateway import Gateway
from plugins.contract.errors import InvalidRequest, UpstreamError
from plugins.contract.protocol import EmbedRequest, EmbedResult, RequestSpec, Usage


async def embed(gateway: Gateway, spec: RequestSpec, request: EmbedRequest,
                accounting: RequestAccounting | None = None) -> tuple[EmbedResult, str]:
    """The embeddings and the backend that made them. A failure before the backend answered is
    tried on the route's next target when the route allows more attempts."""
    observed = Observed(gateway, spec, gateway.plan(spec.model), accounting=accounting)
    while True:
        resolved = observed.next_attempt()
        if resolved is None:
            raise observed.give_up()
        backend = resolved.backend
        try:
            method = getattr(backend, "embed", None)  # `supports_embeddings` was checked; the method may still lack
            if method is None:
                raise InvalidRequest(f"Backend `{backend.name}` does not serve embeddings.", param="model")
            await observed.admit()
            attempt = observed.attempt_spec
            assert attempt is not None
            call = method(msgspec.structs.replace(request, upstream_model=resolved.target.model, headers=attempt.headers))
            if observed.deadline is None:
                result = await call
            else:
                try:
                    async with asyncio.timeout_at(observed.deadline.at):
                        result = await call
                except TimeoutError:
                    raise observed.deadline.error() from None
            _check(result, len(request.inputs), backend.name)
        except BaseException as exc:
            if observed.may_retry(exc):
                continue
            observed.end(exc, first_token=False)
            raise
        observed.committed()
        observed.usage = Usage(prompt_tokens=result.prompt_tokens, completion_tokens=0)
        observed.end(None)
        return result, backend.name


def _check(result: EmbedResult, num_inputs: int, backend: str) -> None:
    if len(result.embeddings) != num_inputs:
        raise UpstreamError(f"Backend `{backend}` returned {len(result.embeddings)} embeddings for {num_inputs} "
                            "inputs.", kind="bad_gateway")


@post("/v1/embeddings", status_code=200, summary="Create embeddings (OpenAI).")
async def create_embeddings(request: Request, state: State) -> Response:
    data = await decode_body(request, EmbeddingsRequest)
    gateway: Gateway = state.gateway
    authorize(request, data.model)
    EMBEDDINGS_FIELDS.screen(data, gateway.metrics.ignored_fields)
    inputs = inputs_of(data)
    spec = gateway.with_routing_keys(routing_spec(data, request_id=request.state.request_id), request.headers)
    embed_request = EmbedRequest(request_id=spec.request_id, upstream_model="", inputs=inputs,
                                 dimensions=data.dimensions, user=data.user)
    # the client gone: the backend's work is cancelled
    done, limit_headers = await accounted(client_request(request), gateway, spec,
                                          lambda accounting: embed(gateway, spec, embed_request, accounting),
                                          cost_of(inputs))
    if done is None:
        return Response(content=b"", status_code=CLIENT_CLOSED_REQUEST)
    result, backend = done
    body = msgspec.json.encode(response(data, result))
    return Response(content=body, media_type="application/json",
                    headers={**response_headers(request, backend), **limit_headers})


HANDLERS = [create_embeddings]
