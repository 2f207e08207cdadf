"""OpenAI's embeddings API (`POST /v1/embeddings`): its structs, the request's checks, the serving
of one request across its attempts, its handler, and the response (floats, or base64 of little-endian
float32 as the `openai` client decodes it).

An embeddings request is routed like a generation (routes, breakers, fallback before anything
came back, backend queues, the deadline, metrics and the request log, under kind "embedding")
and then handed to the backend's `embed()` whole; a backend without it is a 400 naming it.
"""

from __future__ import annotations

import asyncio
import base64
import sys
from array import array
from typing import Annotated, Literal

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from msgspec import Meta, Struct

from gateway.service.accounting import RequestAccounting
from gateway.http.common import (
    CLIENT_CLOSED_REQUEST,
    accounted,
    authorize,
    client_request,
    decode_body,
    response_headers,
)
from gateway.keys.limits import CHARS_PER_TOKEN, TokenCost
from gateway.chat_api.schemas import TokenId
from gateway.service.gateway import Gateway
from gateway.service.attempts import Observed
from plugins.contract.errors import InvalidRequest, UpstreamError
from plugins.contract.protocol import EmbedRequest, EmbedResult, RequestSpec, Sampling, Usage

MAX_INPUTS = 2048  # OpenAI's limit on the items of one request

TokenIds = Annotated[list[TokenId], Meta(min_length=1)]


class EmbeddingsRequest(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """POST /v1/embeddings. `input`: a string, strings, token ids, or lists of token ids."""

    model: str
    input: str | Annotated[list[str | TokenId | TokenIds], Meta(min_length=1, max_length=MAX_INPUTS)]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    user: str | None = None


class EmbeddingData(Struct, forbid_unknown_fields=True, tag="embedding", tag_field="object", kw_only=True):
    index: int
    embedding: list[float] | str  # base64 with `encoding_format: "base64"`


class EmbeddingsUsage(Struct, forbid_unknown_fields=True, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(Struct, forbid_unknown_fields=True, tag="list", tag_field="object", kw_only=True):
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingsUsage


def inputs_of(req: EmbeddingsRequest) -> list[str] | list[list[int]]:
    """The request's items, one text or one list of token ids each; a mixture or an empty string
    is a 400."""
    value = req.input
    if isinstance(value, str):
        items: list = [value]
    elif all(isinstance(v, int) for v in value):
        items = [value]  # one input as token ids
    else:
        items = value
    kinds = {type(v) for v in items}
    if len(kinds) > 1:
        raise InvalidRequest("`input` must be a string, a list of strings, a list of token ids or a list of "
                             "token-id lists, not a mixture.", param="input")
    for i, item in enumerate(items):
        if item == "":
            raise InvalidRequest(f"`input[{i}]` is an empty string; every input needs text.", param="input")
    return items


def routing_spec(req: EmbeddingsRequest, *, request_id: str) -> RequestSpec:
    """What routing, limits and accounting see of an embeddings request."""
    return RequestSpec(request_id=request_id, kind="embedding", model=req.model, upstream_model="",
                       sampling=Sampling(), user=req.user)


def cost_of(inputs: list[str] | list[list[int]]) -> TokenCost:
    """What a key's limits reserve for embedding `inputs` (settled on the backend's count)."""
    return TokenCost(prompt=sum(len(item) if isinstance(item, list) else len(item) // CHARS_PER_TOKEN + 1
                                for item in inputs), completion=0)


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


def response(req: EmbeddingsRequest, result: EmbedResult) -> EmbeddingsResponse:
    as_base64 = req.encoding_format == "base64"
    data = [
        EmbeddingData(index=i, embedding=_base64(vector) if as_base64 else vector)
        for i, vector in enumerate(result.embeddings)
    ]
    usage = EmbeddingsUsage(prompt_tokens=result.prompt_tokens, total_tokens=result.prompt_tokens)
    return EmbeddingsResponse(data=data, model=req.model, usage=usage)


def _base64(vector: list[float]) -> str:
    packed = array("f", vector)  # float32
    if sys.byteorder == "big":
        packed.byteswap()  # the wire format is little-endian
    return base64.b64encode(packed.tobytes()).decode()
