"""`embed()` of the proxy backends: the upstream's `POST /v1/embeddings` (vLLM started with
`--runner pooling --convert embed`, llama.cpp's `llama-server --embeddings`, any OpenAI-compatible
server), asked for floats and read back into one vector per input, in the inputs' order.

Served only when the backend's options say `embeddings = true` (a vLLM instance runs either a
generation or a pooling model, so an embeddings upstream is usually a server of its own). An
upstream that cannot shorten vectors (`honours_dimensions` False: llama.cpp ignores the field)
gets no `dimensions`: the request is refused with a 400 instead of answered at the wrong size.
"""

from __future__ import annotations

from typing import Any

from plugins.contract.errors import InvalidRequest, UpstreamError
from plugins.contract.protocol import EmbedRequest, EmbedResult
from plugins.proxy.upstream import Upstream, upstream_ids


async def embed_upstream(upstream: Upstream, request: EmbedRequest, *, model: str,
                         honours_dimensions: bool) -> EmbedResult:
    """`request` answered by `upstream`, which knows its model as `model`."""
    if request.dimensions is not None and not honours_dimensions:
        raise InvalidRequest(f"Backend `{upstream.name}` cannot shorten embeddings (`dimensions`).", param="dimensions")
    body: dict[str, Any] = {"model": model, "input": request.inputs, "encoding_format": "float"}
    if request.dimensions is not None:
        body["dimensions"] = request.dimensions
    if request.user is not None:
        body["user"] = request.user
    answer = await upstream.request_json("POST", "/v1/embeddings", body,
                                         headers=upstream_ids(request.request_id, request.headers))
    try:
        return _result(answer, len(request.inputs), request.dimensions)
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        raise UpstreamError(f"Backend `{upstream.name}` answered /v1/embeddings in an unexpected shape "
                            f"({type(exc).__name__}: {exc}).", kind="bad_gateway") from None


def _result(answer: Any, num_inputs: int, dimensions: int | None) -> EmbedResult:
    items = sorted(answer["data"], key=lambda item: item["index"])
    vectors = [[float(v) for v in item["embedding"]] for item in items]
    if len(vectors) != num_inputs or [item["index"] for item in items] != list(range(num_inputs)):
        raise ValueError(f"{len(vectors)} embeddings for {num_inputs} inputs")
    if dimensions is not None and any(len(v) != dimensions for v in vectors):
        raise ValueError(f"vectors not of the {dimensions} dimensions asked for")
    usage = answer.get("usage") or {}
    return EmbedResult(embeddings=vectors, prompt_tokens=int(usage.get("prompt_tokens") or 0))
