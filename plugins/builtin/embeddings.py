"""Embeddings from the built-in engine: each input's pooled hidden states, batched through the
engine's scheduler with everything else it runs (`builtin_engine.pooling`), by the engine's
`Embed` call (`builtin_engine.process.calls`), so in process and in an engine process alike.

    [backends.options.embeddings]
    pooling = "last"                 # last | mean | cls
    normalize = true                 # L2-normalize each vector
    matryoshka_dimensions = [64, 128]  # the `dimensions` a client may ask for

`dimensions` (matryoshka truncation) is allowed where the model supports it: the option's list,
else the checkpoint's `config.json` (`matryoshka_dimensions`, or `is_matryoshka: true` for any
length); the model's full size is always allowed; anything else is a 400, as in vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from plugins.builtin.options import EmbeddingOptions
from plugins.contract.errors import InvalidRequest, Overloaded, UpstreamError
from plugins.contract.protocol import EmbedRequest, EmbedResult

if TYPE_CHECKING:
    from builtin_engine.process.client import EngineClient
    from builtin_engine.process.service import EngineService
    from builtin_engine.text.tokenizer import Tokenizer

Dimensions = frozenset[int] | Literal["any"] | None  # `allowed_dimensions`


def allowed_dimensions(model_dir: Path, options: EmbeddingOptions) -> Dimensions:
    """The `dimensions` the model may be truncated to: a set, "any", or None (not matryoshka)."""
    if options.matryoshka_dimensions is not None:
        return frozenset(options.matryoshka_dimensions)
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    listed = config.get("matryoshka_dimensions")
    if isinstance(listed, list) and all(isinstance(d, int) for d in listed):
        return frozenset(listed)
    return "any" if config.get("is_matryoshka") is True else None


async def embed(engine: EngineService | EngineClient, tokenizer: Tokenizer, request: EmbedRequest, *,
                options: EmbeddingOptions, allowed: Dimensions, model: str) -> EmbedResult:
    """Pool every input with one `Embed` call, in this process or the engine's (the engine keeps
    at most a batch's worth of them waiting, so a large request never fills its queue).
    `allowed`: the model's `allowed_dimensions`; `model`: its served name, for messages.
    Cancelled (the client left): the call's stream is closed, which aborts what still runs."""
    from builtin_engine.errors import EngineError
    from builtin_engine.process.calls import Embed

    prompts = [tokenizer.encode(item, add_special_tokens=True) if isinstance(item, str) else list(item)
               for item in request.inputs]
    assert engine.info is not None
    dimensions = _dimensions(request.dimensions, engine.info.hidden_size, allowed, model)
    call = Embed(request_id=request.request_id, prompts=prompts, pooling=options.pooling,
                 normalize=options.normalize, dimensions=dimensions)
    outputs = engine.stream(call)
    try:
        vectors = [output.embedding async for output in outputs]
    except EngineError as exc:
        raise _map_error(exc) from exc
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]
    return EmbedResult(embeddings=vectors, prompt_tokens=sum(len(p) for p in prompts))


def _dimensions(asked: int | None, size: int, allowed: Dimensions, model: str) -> int | None:
    if asked is None:
        return None
    if asked == size:
        return None
    if allowed is None:
        raise InvalidRequest(f"Model `{model}` does not support matryoshka representation: its "
                             f"embeddings are {size}-dimensional, and shortening them would give poor vectors.",
                             param="dimensions")
    if (allowed == "any" and asked > size) or (allowed != "any" and asked not in allowed):
        which = f"at most {size}" if allowed == "any" else f"one of {sorted(allowed)}"
        raise InvalidRequest(f"`dimensions` {asked} is not supported by model `{model}`; "
                             f"ask for {which}.", param="dimensions")
    return asked


def _map_error(exc: BaseException) -> Exception:
    from builtin_engine import errors as e

    if isinstance(exc, e.InvalidRequestError):
        return InvalidRequest(str(exc), param="input" if exc.param == "prompt" else exc.param)
    if isinstance(exc, e.QueueFull):
        return Overloaded(str(exc), retry_after_s=1.0)
    return UpstreamError(str(exc), kind="unavailable")
