"""max_tokens, stop_strings and stream_parity: a request means the same on every backend."""

from __future__ import annotations

from plugins.contract.protocol import Finish
from plugins.testing.checks.prompts import REFERENCE_TOKENS, STORY, pick_stop, reference
from plugins.testing.probe import Probe
from plugins.testing.registry import Skipped, check
from plugins.testing.trace import Failed

CAP = 3


@check("max_tokens", fix=(
    "Stop each choice after max_tokens generated tokens (spec.sampling.max_tokens) and finish it with reason "
    "'length'; report exactly that many completion_tokens."))
async def max_tokens(probe: Probe) -> str:
    """A request capped at max_tokens=3 finishes with 'length' after exactly 3 tokens."""
    trace = (await probe.run(probe.chat(STORY, max_tokens=CAP), f"chat, max_tokens={CAP}")).ok()
    if trace.finish() != "length":
        raise Failed(f"finished with {trace.finish()!r}; a choice cut by max_tokens finishes with 'length'", trace)
    got = trace.usage.completion_tokens  # type: ignore[union-attr]
    if got != CAP:
        raise Failed(f"finished with 'length' but completion_tokens is {got}, not max_tokens={CAP}", trace)
    return f"'length' after {CAP} tokens: {trace.text()!r}"


@check("stop_strings", fix=(
    "End a choice at the first occurrence of any spec.sampling.stop string (also across token boundaries), "
    "send the text before it and not the stop string itself (unless include_stop_str_in_output), hold back "
    "text that may be the start of a stop string, and finish with reason 'stop' (naming the string in "
    "Finish.stop_sequence, or None)."))
async def stop_strings(probe: Probe) -> str:
    """A stop string ends the text right before it with finish 'stop', and is not sent."""
    text = (await reference(probe)).text()
    stop = pick_stop(text)
    if stop is None:
        raise Skipped(f"the reference answer is too short to pick a stop string from: {text!r}")
    spec = probe.chat(STORY, max_tokens=REFERENCE_TOKENS, stream=True, stop=[stop])
    trace = (await probe.run(spec, f"chat, stream, stop=[{stop!r}]")).ok()
    got, expected = trace.text(), text[: text.find(stop)]
    if stop in got:
        raise Failed(f"the stop string {stop!r} was sent to the client: {got!r}", trace)
    if got != expected:
        raise Failed(f"with stop {stop!r} the text should be {expected!r} (the reference up to the stop string), "
                     f"got {got!r}", trace, await reference(probe))
    if trace.finish() != "stop":
        raise Failed(f"the stop string ended the text but the choice finished with {trace.finish()!r}", trace)
    named = next((e.stop_sequence for e in trace.events if isinstance(e, Finish)), None)
    if named not in (None, stop):
        raise Failed(f"Finish.stop_sequence is {named!r}, but the stop string that ended the text is {stop!r}", trace)
    return f"stop {stop!r} ends the text at {len(got)} characters, not sent"


@check("stream_parity", fix=(
    "Generate the same way whether spec.stream is true or false: the gateway assembles a non-streamed answer "
    "from the same events, so the backend should not branch on it."))
async def stream_parity(probe: Probe) -> str:
    """The same request at temperature 0 gives the same text streamed and not streamed."""
    streamed = await reference(probe)
    plain = (await probe.run(probe.chat(STORY, max_tokens=REFERENCE_TOKENS, stream=False),
                             "chat, temperature 0, not streamed")).ok()
    if plain.text() != streamed.text() or plain.finish() != streamed.finish():
        raise Failed(f"streamed: {streamed.text()!r} ({streamed.finish()}); not streamed: {plain.text()!r} "
                     f"({plain.finish()})", streamed, plain)
    return f"{len(plain.text())} characters, identical"
