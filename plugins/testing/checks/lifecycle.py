"""lifecycle: the backend starts, is healthy and lists models it serves."""

from __future__ import annotations

import msgspec

from plugins.contract.protocol import Capabilities, ModelInfo
from plugins.testing.checks.prompts import SHORT
from plugins.testing.probe import Probe
from plugins.testing.registry import check
from plugins.testing.trace import Failed, describe_error

MODELS_SERVED = 3  # model ids that must each answer a request


@check("lifecycle", needs_model=False, fix=(
    "start() loads what the backend needs and raises a plugins.contract.errors.ConfigError naming the bad option; "
    "health() returns True once it can serve; models() returns at least one ModelInfo whose id has no "
    "whitespace and is the name generate() accepts as spec.upstream_model."))
async def lifecycle(probe: Probe) -> str:
    """start() succeeds, health() is True, models() lists model ids that each answer a request."""
    opening = probe.opening
    if opening.start_error is not None:
        raise Failed(f"start() raised {describe_error(opening.start_error)}")
    if opening.models_error is not None:
        raise Failed(f"models() raised {describe_error(opening.models_error)}")
    infos = opening.models or []
    if not infos:
        raise Failed("models() returned no model: the gateway would serve nothing from this backend")
    ids = [info.id if isinstance(info, ModelInfo) else None for info in infos]
    bad = [repr(i) for i in ids if not isinstance(i, str) or not i or any(c.isspace() or not c.isprintable() for c in i)]
    if bad:
        raise Failed(f"models() lists ids that are not usable model names: {', '.join(bad)}")
    if len(set(ids)) != len(ids):
        raise Failed(f"models() lists an id twice: {ids}")
    healthy = opening.healthy
    if isinstance(healthy, BaseException):
        raise Failed(f"health() raised {describe_error(healthy)}; it returns False when the backend cannot serve")
    if healthy is not True:
        raise Failed(f"health() returned {healthy!r} after start(); True is expected while it can serve")
    if not probe.model:
        raise Failed(f"the model {probe.wanted_model!r} is not among models(): {', '.join(map(str, ids))}")
    if not isinstance(probe.backend.name, str) or not probe.backend.name:
        raise Failed(f"the backend's `name` is {probe.backend.name!r}; it must be its [[backends]] name")
    if not isinstance(probe.caps, Capabilities):
        raise Failed(f"capabilities() returned a {type(probe.caps).__name__}, not a Capabilities")
    for model in [probe.model, *[i for i in ids if i != probe.model]][:MODELS_SERVED]:
        spec = msgspec.structs.replace(probe.chat(SHORT, max_tokens=1), model=model, upstream_model=model)
        (await probe.run(spec, f"chat to model {model!r}, max_tokens=1")).ok()
    return (f"start() took {opening.start_s:.1f} s; health() True; models(): {', '.join(map(str, ids))}; "
            f"{min(len(ids), MODELS_SERVED)} answered")
