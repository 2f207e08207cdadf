"""concurrency: 32 requests at once each get their own answer.

Each request asks about its own topic. Its answer alone (sent by itself, first) is the
reference; sent together, every request must have the same frame of Finish and Usage events as
alone and its own prompt's usage, and its text must be its own: equal to its reference, or —
where batching changes an engine's greedy arithmetic (vLLM on CPU does, by whole phrases on a
CPU with AMX) — still its own: it names its own topic ("The rocket is a marvel of modern
engineering" for the rocket, alone "The rocket is a futuristic spacecraft"), or, naming none, it
shares no more words (case aside) with another request's reference than with its own and names
no other topic. A crossed stream carries another request's answer, and so its topic.
"""

from __future__ import annotations

import asyncio
import string
from collections import Counter

from plugins.contract.protocol import Finish, Usage
from plugins.testing.checks.prompts import TOPICS
from plugins.testing.probe import Probe
from plugins.testing.registry import check
from plugins.testing.trace import Failed, Trace

CONCURRENCY = 32
TOKENS = 8


def _shared_words(a: str, b: str) -> int:
    """How many words (with repeats, case aside) the two texts have in common."""
    return sum((Counter(a.casefold().split()) & Counter(b.casefold().split())).values())


@check("concurrency", fix=(
    "Keep every piece of per-request state (queues, buffers, detokenizers, sequence ids) in generate()'s own "
    "frame or keyed by the request, never in a shared attribute; route each engine output to the request it "
    "belongs to."))
async def concurrency(probe: Probe) -> str:
    """32 concurrent requests all complete, each with its own text and usage (no crossed streams)."""
    specs = [probe.chat(f"Write one sentence about the {topic}.", max_tokens=TOKENS) for topic in TOPICS[:CONCURRENCY]]
    alone = [(await probe.run(spec, f"request {i} alone")).ok() for i, spec in enumerate(specs)]
    together = await asyncio.gather(*(probe.run(spec, f"request {i} of {CONCURRENCY} at once")
                                      for i, spec in enumerate(specs)))
    drifted = 0
    for i, trace in enumerate(together):
        trace.ok()
        if _frame(trace) != _frame(alone[i]):
            raise Failed(f"request {i} got the Finish / Usage events {_frame(trace)} at once but {_frame(alone[i])} "
                         "alone: events of other requests reached its stream", trace, alone[i])
        if trace.usage.prompt_tokens != alone[i].usage.prompt_tokens:  # type: ignore[union-attr]
            raise Failed(f"request {i} reports prompt_tokens={trace.usage.prompt_tokens} at once but "  # type: ignore[union-attr]
                         f"{alone[i].usage.prompt_tokens} alone: usage crossed to another request", trace, alone[i])  # type: ignore[union-attr]
        text = trace.text()
        if text == alone[i].text():
            continue
        drifted += 1
        _check_own(i, text, alone, trace)
    note = f"; {drifted} drifted from their solo text, each nearest its own" if drifted else ""
    return f"{CONCURRENCY} at once, each its own text and usage{note}"


def _frame(trace: Trace) -> list[str]:
    """The stream's frame: its Finish and Usage events in order, without their values."""
    return [f"{type(e).__name__}[{getattr(e, 'index', '')}]" for e in trace.events if isinstance(e, (Finish, Usage))]


def _words(text: str) -> set[str]:
    return {word.strip(string.punctuation) for word in text.casefold().split()}


def _check_own(i: int, text: str, alone: list[Trace], trace: Trace) -> None:
    words = _words(text)
    if TOPICS[i] in words:
        return
    own = alone[i].text()
    mine = _shared_words(text, own)
    for j, other in enumerate(alone):
        if j != i and other.text() != own and (TOPICS[j] in words or _shared_words(text, other.text()) > mine):
            raise Failed(f"request {i} got {text!r}, nearer request {j}'s answer {other.text()!r} than its own "
                         f"{own!r}: streams crossed", trace, alone[i], alone[j])
