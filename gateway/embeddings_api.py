"""OpenAI's embeddings API (`POST /v1/embeddings`): its structs, the request's checks, the serving
of one request across its attempts, and the response (floats, or base64 of little-endian
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
from msgspec import Meta, Struct

from gateway.chat_completions import Observed
from gateway.schemas import TokenId
from gateway.service import Gateway
from plugins.errors import InvalidRequest, UpstreamError
from plugins.protocol import EmbedRequest, EmbedResult, RequestSpec, SamplingParams, Usage

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
                       sampling=SamplingParams(), user=req.user)


async def embed(gateway: Gateway, spec: RequestSpec, request: EmbedRequest) -> tuple[EmbedResult, str]:
    """The embeddings and the backend that made them. A failure before the backend answered is
    tried on the route's next target when the route allows more attempts."""
    observed = Observed(gateway, spec, gateway.plan(spec.model))
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
            call = method(msgspec.structs.replace(request, upstream_model=resolved.target.model))
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
