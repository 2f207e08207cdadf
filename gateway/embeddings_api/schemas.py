"""OpenAI's embeddings API as msgspec structs: `POST /v1/embeddings` and its response, snake_case
as on the wire; the request is decoded strictly (an unknown field is a 400)."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct

from gateway.chat_api.schemas import TokenId

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
