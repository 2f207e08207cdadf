"""errors: failures reach the gateway as `plugins.contract.errors` types, which it maps to HTTP once."""

from __future__ import annotations

import msgspec

from plugins.contract.errors import ContextLengthExceeded, SwitchyardError
from plugins.contract.protocol import TextDelta
from plugins.testing.checks.prompts import SHORT
from plugins.testing.probe import Probe
from plugins.testing.registry import check
from plugins.testing.trace import Failed, Trace, describe_error

FILLER = "switchyard "
UNKNOWN_MODEL = "plugin-check-no-such-model"
TOKEN_ID_OUT_OF_RANGE = 2**31 - 1


@check("errors", fix=(
    "Raise plugins.contract.errors types only: ContextLengthExceeded when prompt + max_tokens do not fit max_model_len, "
    "ModelNotFound for a model it does not serve, InvalidRequest for input it cannot take, UpstreamError(kind=...) "
    "when the engine or server behind it fails; map the engine's own exceptions once, in the backend. A bare "
    "exception becomes a 500 and counts against the backend's circuit breaker."))
async def errors(probe: Probe) -> str:
    """A prompt over max_model_len raises ContextLengthExceeded; other failures raise plugins.contract.errors types."""
    notes = [await _over_long_prompt(probe)]
    unknown = msgspec.structs.replace(probe.chat(SHORT, max_tokens=2), model=UNKNOWN_MODEL, upstream_model=UNKNOWN_MODEL)
    notes.append(_typed_if_failed(await probe.run(unknown, f"chat to model {UNKNOWN_MODEL!r}"), "an unknown model"))
    if probe.caps.supports_completions:
        spec = probe.completion([TOKEN_ID_OUT_OF_RANGE], max_tokens=2)
        notes.append(_typed_if_failed(await probe.run(spec, f"completion of token id {TOKEN_ID_OUT_OF_RANGE}"),
                                      "a token id outside the vocabulary"))
    healthy = await probe.backend.health()
    after = (await probe.run(probe.chat(SHORT, max_tokens=2), "chat after the failures"))
    if healthy is not True or after.error is not None:
        raise Failed(f"after the failed requests health() is {healthy!r} and a plain request "
                     f"{'raised ' + describe_error(after.error) if after.error else 'worked'}", after)
    return "; ".join(notes)


async def _over_long_prompt(probe: Probe) -> str:
    limit = probe.max_model_len
    if not limit:
        return "max_model_len unknown (neither capabilities() nor models() say it): over-long prompts not tried"
    spec = probe.chat(FILLER * (limit + 64), max_tokens=4)
    counted = await probe.prompt_tokens(spec)
    if counted is not None and counted <= limit:
        spec = probe.chat(FILLER * (2 * limit + 64), max_tokens=4)
    trace = await probe.run(spec, f"chat with a prompt over max_model_len={limit}")
    if not isinstance(trace.error, ContextLengthExceeded):
        got = describe_error(trace.error) if trace.error else "no error"
        raise Failed(f"a prompt longer than max_model_len={limit} should raise ContextLengthExceeded; got {got}", trace)
    if any(isinstance(e, TextDelta) for e in trace.events):
        raise Failed("ContextLengthExceeded came after text was sent: check the length before generating", trace)
    return f"over max_model_len={limit}: ContextLengthExceeded"


def _typed_if_failed(trace: Trace, what: str) -> str:
    if trace.error is None:
        return f"{what}: served"
    if not isinstance(trace.error, SwitchyardError):
        raise Failed(f"{what}: the backend raised {describe_error(trace.error)}, not a plugins.contract.errors type", trace)
    return f"{what}: {type(trace.error).__name__}"
