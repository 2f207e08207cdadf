"""embeddings: a backend that declares `supports_embeddings` serves `embed()` honestly."""

from __future__ import annotations

import itertools
import math

from plugins.contract.errors import InvalidRequest, SwitchyardError
from plugins.contract.protocol import EmbedRequest, EmbedResult
from plugins.testing.probe import Probe
from plugins.testing.registry import check
from plugins.testing.trace import Failed, describe_error

TEXTS = ("The capital of France is Paris.", "Bananas are yellow and grow in bunches.")
SAME_VECTOR_COSINE = 0.999  # one input alone and in a batch: equal up to batched arithmetic
_ids = itertools.count(1)


@check("embeddings", fix=(
    "Declare supports_embeddings only with an embed() method; return one vector per input, in the inputs' "
    "order, all of one length and finite, the same for an input whatever else is in the batch; count every "
    "input's tokens in prompt_tokens; honour dimensions by truncating or raise InvalidRequest(param='dimensions')."))
async def embeddings(probe: Probe) -> str:
    """With supports_embeddings: one finite vector per input, in order, batch-independent; prompt_tokens adds up."""
    if not probe.caps.supports_embeddings:
        return "supports_embeddings is False: the gateway refuses /v1/embeddings before the backend"
    embed = getattr(probe.backend, "embed", None)
    if not callable(embed):
        raise Failed("capabilities() declares supports_embeddings, but the backend has no embed() method")
    both = await _embed(probe, list(TEXTS))
    alone = [await _embed(probe, [text]) for text in TEXTS]
    width = len(both.embeddings[0])
    for result in (*alone, both):
        if not width or any(len(v) != width or not all(map(math.isfinite, v)) for v in result.embeddings):
            raise Failed(f"embed() gave vectors of lengths {[len(v) for v in result.embeddings]} (or not finite); "
                         f"expected {width or 'at least 1'} finite floats each")
    for i, single in enumerate(alone):
        cosine = _cosine(single.embeddings[0], both.embeddings[i])
        if cosine < SAME_VECTOR_COSINE:
            raise Failed(f"input {i} embedded alone and in a batch of {len(TEXTS)} differs (cosine {cosine:.4f}): "
                         "vectors came out of order or crossed")
    if _cosine(*both.embeddings) > SAME_VECTOR_COSINE:
        raise Failed("two different inputs got the same vector")
    added = sum(result.prompt_tokens for result in alone)
    if both.prompt_tokens != added or min(r.prompt_tokens for r in alone) < 1:
        raise Failed(f"prompt_tokens for both inputs is {both.prompt_tokens}, but the inputs alone count "
                     f"{' + '.join(str(r.prompt_tokens) for r in alone)} = {added}")
    shorter = await _dimensions(probe, width)
    return f"{len(TEXTS)} inputs: {width} dims each, batch-independent, prompt_tokens {both.prompt_tokens}; {shorter}"


async def _dimensions(probe: Probe, width: int) -> str:
    shorter = max(1, width // 2)
    try:
        result = await _embed(probe, [TEXTS[0]], dimensions=shorter)
    except Failed as failed:
        if isinstance(failed.__cause__, InvalidRequest):
            return f"dimensions={shorter} refused with InvalidRequest"
        raise
    got = len(result.embeddings[0])
    if got != shorter:
        raise Failed(f"dimensions={shorter} gave vectors of {got}; truncate or raise InvalidRequest(param='dimensions')")
    return f"dimensions={shorter} honoured"


async def _embed(probe: Probe, inputs: list[str], *, dimensions: int | None = None) -> EmbedResult:
    request = EmbedRequest(request_id=f"plugin-check-embed-{next(_ids)}", upstream_model=probe.model,
                           inputs=inputs, dimensions=dimensions)
    try:
        result = await probe.backend.embed(request)  # type: ignore[attr-defined]
    except SwitchyardError as exc:
        raise Failed(f"embed({inputs!r:.80}, dimensions={dimensions}) raised {describe_error(exc)}") from exc
    except Exception as exc:  # noqa: BLE001 - the finding
        raise Failed(f"embed() raised {describe_error(exc)}, not a plugins.contract.errors type") from exc
    if not isinstance(result, EmbedResult) or len(result.embeddings) != len(inputs):
        count = len(result.embeddings) if isinstance(result, EmbedResult) else type(result).__name__
        raise Failed(f"embed() of {len(inputs)} inputs returned {count} vectors")
    return result


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    norm = math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    return dot / norm if norm else 0.0
