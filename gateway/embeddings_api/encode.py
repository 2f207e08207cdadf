"""The embeddings response: floats, or base64 of little-endian float32 as the `openai` client
decodes it."""

from __future__ import annotations

import base64
import sys
from array import array

from gateway.embeddings_api.schemas import EmbeddingData, EmbeddingsRequest, EmbeddingsResponse, EmbeddingsUsage
from plugins.contract.protocol import EmbedResult


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
