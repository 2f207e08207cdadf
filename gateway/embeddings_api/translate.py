"""An embeddings request → its inputs (one text or one list of token ids each), what routing,
limits and accounting see of it (a `RequestSpec` of kind "embedding"), and what a key's limits
reserve for it."""

from __future__ import annotations

from gateway.embeddings_api.schemas import EmbeddingsRequest
from gateway.keys.limits import CHARS_PER_TOKEN, TokenCost
from plugins.contract.errors import InvalidRequest
from plugins.contract.protocol import RequestSpec, Sampling


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
