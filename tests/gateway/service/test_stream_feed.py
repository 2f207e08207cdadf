"""`StreamFeed.push_text`, the short path of a pushed plain token, against `push` of the same
token as a `TextDelta`: the same bytes written, the same token marks, the same accounting,
the same hand-over when the client's transport refuses a write."""

from __future__ import annotations

import types

from gateway.chat_api.chunks import ChunkEncoder
from gateway.chat_api.encode import _StreamState
from gateway.keys import NO_RESERVATION
from gateway.service.accounting import RequestAccounting
from gateway.service.request_timer import RequestTimer
from gateway.service.stream_feed import StreamFeed
from plugins.contract.protocol import RequestSpec, Sampling, TextDelta

TOKENS = [(0, " a"), (1, "é\"\\\n"), (0, "%s %d"), (1, "\u2028 \U0001f600")]


def _feed(refuse: int | None = None) -> tuple[StreamFeed, list[bytes], types.SimpleNamespace]:
    """A chat stream's feed whose client write number `refuse` (0-based) is refused once."""
    spec = RequestSpec(request_id="r", kind="chat", model="m%", upstream_model="u", sampling=Sampling(n=2),
                       stream=True, include_usage=True)
    encoder = ChunkEncoder(id="chatcmpl-1", created=7, model="m%", fingerprint="fp", chat=True, include_usage=True)
    written: list[bytes] = []
    tries = [0]

    def write(out: bytes) -> bool:
        tries[0] += 1
        if tries[0] - 1 == refuse:
            return False
        written.append(out)
        return True

    observed = types.SimpleNamespace(timer=RequestTimer(), accounting=RequestAccounting(NO_RESERVATION, None))
    return StreamFeed(observed.timer, observed.accounting, _StreamState(encoder, spec), write), written, observed


def _push(feed: StreamFeed, short: bool, index: int, text: str) -> bool:
    return feed.push_text(index, text) if short else feed.push([TextDelta(text=text, index=index)])


def test_push_text_writes_what_push_of_the_delta_writes() -> None:
    runs = []
    for short in (True, False):
        feed, written, observed = _feed()
        assert [_push(feed, short, i, t) for i, t in TOKENS] == [True] * len(TOKENS)
        assert observed.accounting.completion_seen == len(TOKENS)
        assert observed.timer.first_token is not None and len(observed.timer.itl) == len(TOKENS) - 1
        runs.append(written)
    assert runs[0] == runs[1] and len(runs[0]) == len(TOKENS)


def test_a_refused_write_is_kept_and_leads_the_next_bytes() -> None:
    """The refused bytes are kept (False: the task takes over); what comes next, pushed or fed
    by the task, goes out behind them, in order, on either path."""
    runs = []
    for short in (True, False):
        feed, written, _ = _feed(refuse=1)
        results = [_push(feed, short, i, t) for i, t in TOKENS[:2]]
        assert results == [True, False] and feed.kept and len(written) == 1
        kept = feed.kept
        assert _push(feed, short, *TOKENS[2]) is True
        assert feed.kept == b"" and written[1].startswith(kept)
        written.append(feed.feed([TextDelta(text=TOKENS[3][1], index=TOKENS[3][0])]))
        runs.append(written)
    assert runs[0] == runs[1]
