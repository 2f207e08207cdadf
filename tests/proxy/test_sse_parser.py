"""The incremental SSE parser on streams real vLLM and llama.cpp servers sent."""

from __future__ import annotations

import pytest

from plugins.sse_parser import SSEEvent, SSEParser
from tests.proxy.recordings import Recording, all_recordings

SSE = [r for r in all_recordings() if r.is_sse and r.status == 200]


def parse(pieces: list[bytes]) -> list[SSEEvent]:
    parser = SSEParser()
    events = []
    for piece in pieces:
        events += parser.feed(piece)
    parser.close()
    return events


def test_there_are_recordings_of_both_engines() -> None:
    assert {r.engine for r in SSE} == {"vllm", "llamacpp"}


@pytest.mark.parametrize("rec", SSE, ids=lambda r: r.id)
def test_same_events_whatever_the_split(rec: Recording) -> None:
    whole = parse([rec.body])
    assert whole, "no events"
    assert whole[-1].data == "[DONE]"
    assert parse(rec.chunks) == whole  # as the bytes really arrived
    assert parse([rec.body[i : i + 1] for i in range(len(rec.body))]) == whole  # byte by byte
    assert parse([rec.body[i : i + 7] for i in range(0, len(rec.body), 7)]) == whole  # splits inside UTF-8 too


@pytest.mark.parametrize("rec", SSE, ids=lambda r: r.id)
def test_line_endings_crlf_and_cr(rec: Recording) -> None:
    whole = parse([rec.body])
    crlf = rec.body.replace(b"\n", b"\r\n")
    assert parse([crlf[i : i + 5] for i in range(0, len(crlf), 5)]) == whole
    cr = rec.body.replace(b"\n", b"\r")
    assert parse([cr[i : i + 3] for i in range(0, len(cr), 3)]) == whole


@pytest.mark.parametrize("rec", SSE, ids=lambda r: r.id)
def test_each_event_comes_out_as_soon_as_its_blank_line_arrives(rec: Recording) -> None:
    """Feeding byte by byte, an event is returned by exactly the feed() that completes it."""
    completes_at = set()  # byte offsets of the LF that ends an event (these bodies use LF only)
    pending, pos = False, 0
    for line in rec.body.split(b"\n")[:-1]:
        end = pos + len(line)
        if line == b"" and pending:
            completes_at.add(end)
            pending = False
        elif line.startswith(b"data"):
            pending = True
        pos = end + 1
    parser = SSEParser()
    for i in range(len(rec.body)):
        got = parser.feed(rec.body[i : i + 1])
        assert len(got) == (1 if i in completes_at else 0), f"at byte {i}"


def test_comments_bom_and_multiline_data() -> None:
    rec = next(r for r in SSE if r.engine == "llamacpp")
    events = parse([rec.body])
    noisy = b"\xef\xbb\xbf: keep-alive\n\n" + rec.body.replace(b"\n\n", b"\n\n: ping\n\n", 2)
    assert parse([noisy[i : i + 4] for i in range(0, len(noisy), 4)]) == events
    multi = parse([b"event: error\ndata: {\"a\":\ndata: 1}\nid: 7\n\n"])
    assert multi == [SSEEvent('{"a":\n1}', event="error", id="7")]
    assert parse([b"data: unterminated"]) == []  # no blank line: discarded at close
