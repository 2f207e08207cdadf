"""The incremental SSE parser on streams real vLLM and llama.cpp servers sent."""

from __future__ import annotations

import pytest

from plugins.transport.sse import SSEEvent, SSEParser
from tests.support.recordings import Recording, all_recordings

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


def _line_machinery(piece: bytes) -> list[SSEEvent]:
    """What the line machinery alone makes of `piece` (`whole_data` bypassed)."""
    parser = SSEParser()
    parser.whole_data = lambda piece: None  # type: ignore[method-assign]
    return parser.feed(piece)


@pytest.mark.parametrize("piece", [
    b"data: a\n\n", b"data: \n\n", b"data: a\n\ndata: b\n\n", b"data: a\n\ndata: \n\ndata: c\n\n",
    b"data: data: x\n\n", b'data: {"t":"\\n\\ndata: "}\n\n',
    b"data: a\n\n\n", b"data: a\ndata: b\n\n", b"data: a\n\ndata:b\n\n", b"data: a\n\n: ping\n\n",
    b"data: x\n\ndata: y\nid: 3\n\n", b"data:x\n\n", b"data: a\n\ndata: b\n", b"data: a\n\n\ndata: b\n\n",
    b"\n\ndata: a\n\n", b"data: a\r\n\r\n", b"event: e\ndata: x\n\n", b"data: a\n\nevent: e\n\n",
])
def test_the_fast_path_reads_what_the_lines_say(piece: bytes) -> None:
    """`whole_data` answers only for pieces of whole one-line `data:` events, and then with the
    data the line machinery reads; anything else is left to it (None)."""
    events = _line_machinery(piece)
    plain = piece.endswith(b"\n\n") and all(e.event == "message" and "\n" not in e.data for e in events)
    datas = SSEParser().whole_data(piece)
    if datas is not None:
        assert plain and datas == [e.data.encode() for e in events]
        assert piece == b"".join(b"data: " + d + b"\n\n" for d in datas)
    elif events and piece == b"".join(b"data: " + e.data.encode() + b"\n\n" for e in events):
        raise AssertionError("plain one-line data events left to the line machinery")


@pytest.mark.parametrize("piece", [
    b"data: a\n\n", b"data: \n\n", b"data: a\n\ndata: b\n\n", b"data: {}\n\n\n", b"data: a\ndata: b\n\n",
    b"data:x\n\n", b"data: a\n", b"\n\ndata: a\n\n", b"data: a\r\n\r\n", b"data: a\r\n\n", b"event: e\ndata: x\n\n",
    b": ping\n\n", b"data: a\n\n: c", b'data: {"t":"\\n\\ndata: "}\n\n',
])
def test_one_data_is_whole_data_of_one_event(piece: bytes) -> None:
    """`one_data` answers only for a piece of exactly one plain `data:` event (after the first
    line, which may hold a BOM), with its one `whole_data`."""
    parser = SSEParser()
    assert parser.one_data(piece) is None  # the first line is the line machinery's
    parser.feed(b"data: first\n\n")
    datas = parser.whole_data(piece)
    data = parser.one_data(piece)
    if data is None:
        assert datas is None or len(datas) != 1
    else:
        assert datas == [data]
    assert (data is not None) == (piece in (b"data: a\n\n", b"data: \n\n", b'data: {"t":"\\n\\ndata: "}\n\n'))
    parser.feed(b"data: half")
    assert parser.one_data(b"data: a\n\n") is None  # an event in progress: the line machinery's
