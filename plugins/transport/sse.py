"""An incremental Server-Sent Events parser (the WHATWG `text/event-stream` rules).

Bytes go in as they arrive from the socket, in pieces of any size; every event whose blank
line has arrived comes out at once, so nothing is held back waiting for a buffer to fill. A
line may be split across pieces (even inside a CR LF pair or a UTF-8 character): the parser
keeps only the unfinished tail.

    parser = SSEParser()
    for piece in pieces:
        for event in parser.feed(piece):
            ...
    parser.close()   # an event without its final blank line is dropped, as the spec says

Only `data`, `event` and `id` fields matter to the proxies; `retry` and comments are read and
ignored.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

_BOM = "\ufeff"


class SSEEvent:
    """One dispatched event: `data` is the `data:` lines joined by LF, `event` its type
    (default "message"), `id` the last event id seen (None if none)."""

    __slots__ = ("data", "event", "id")

    def __init__(self, data: str, event: str = "message", id: str | None = None) -> None:
        self.data = data
        self.event = event
        self.id = id

    def __repr__(self) -> str:
        return f"SSEEvent(event={self.event!r}, data={self.data!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SSEEvent) and (self.data, self.event, self.id) == (other.data, other.event, other.id)


class SSEParser:
    def __init__(self) -> None:
        self._buf = bytearray()
        self._data: list[str] = []
        self._event = ""
        self._last_id: str | None = None
        self._has_data = False
        self._first_line = True
        self._pending_cr = False  # the last piece ended with CR: a following LF belongs to it

    def feed(self, piece: bytes) -> list[SSEEvent]:
        """Add bytes; return the events completed by them (possibly none)."""
        if not piece:
            return []
        payloads = self.whole_data(piece)
        if payloads is not None:
            last_id = self._last_id
            return [SSEEvent(data.decode("utf-8", errors="replace"), "message", last_id) for data in payloads]
        if self._pending_cr:
            self._pending_cr = False
            if piece[:1] == b"\n":
                piece = piece[1:]
        buf = self._buf
        buf += piece
        events: list[SSEEvent] = []
        start = 0
        n = len(buf)
        while start < n:
            # the next line end: LF, CR or CR LF
            lf = buf.find(b"\n", start)
            cr = buf.find(b"\r", start, lf if lf >= 0 else n)
            if cr >= 0:
                end = cr
                if cr + 1 < n:
                    nxt = cr + 2 if buf[cr + 1] == 0x0A else cr + 1
                else:
                    nxt = cr + 1
                    self._pending_cr = True
            elif lf >= 0:
                end, nxt = lf, lf + 1
            else:
                break
            event = self._line(bytes(buf[start:end]))
            if event is not None:
                events.append(event)
            start = nxt
        if start:
            del buf[:start]
        return events

    def whole_data(self, piece: bytes) -> list[bytes] | None:
        """The common case read without the line machinery: when `piece` (not empty) is nothing
        but whole `data: ...` events of one line each (LF line ends), as every engine sends, and
        nothing is pending from earlier pieces, their data, not decoded yet (`feed` would return
        them as "message" events). None when the piece is anything else: then `feed` it."""
        if not piece or self._buf or self._pending_cr or self._has_data or self._event:
            return None
        if self._first_line:
            if piece[0] == 0xEF:  # a BOM (or the start of one) to strip: the line machinery does it
                return None
            self._first_line = False
        if b"\r" in piece or not piece.startswith(b"data: ") or not piece.endswith(b"\n\n"):
            return None
        datas = piece[6:-2].split(b"\n\ndata: ")
        if piece.count(b"\n") != 2 * len(datas):  # a line end besides the events' own: a line of another kind
            return None
        return datas

    def one_data(self, piece: bytes) -> bytes | None:
        """`whole_data` of a piece that is exactly one such event (a stream's usual read): its
        data; None for any other piece, or before the first line was read."""
        if self._first_line or self._buf or self._pending_cr or self._has_data or self._event:
            return None
        if piece.count(b"\n") != 2 or b"\r" in piece or not piece.startswith(b"data: ") or not piece.endswith(b"\n\n"):
            return None
        return piece[6:-2]

    def close(self) -> list[SSEEvent]:
        """End of stream. A final line without its terminator is still a line, but an event
        not followed by a blank line is discarded (spec). Returns nothing today; kept so a
        caller need not know that."""
        if self._buf:
            self._line(bytes(self._buf))
            self._buf.clear()
        self._data.clear()
        self._has_data = False
        return []

    def _line(self, raw: bytes) -> SSEEvent | None:
        line = raw.decode("utf-8", errors="replace")
        if self._first_line:
            self._first_line = False
            if line.startswith(_BOM):
                line = line[1:]
        if not line:
            return self._dispatch()
        if line[0] == ":":
            return None  # comment (keep-alive pings)
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._has_data = True
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\x00" not in value:
                self._last_id = value
        # "retry" and unknown fields: ignored
        return None

    def _dispatch(self) -> SSEEvent | None:
        if not self._has_data:
            self._event = ""
            return None
        event = SSEEvent("\n".join(self._data), self._event or "message", self._last_id)
        self._data = []
        self._has_data = False
        self._event = ""
        return event


async def aiter_sse(pieces: AsyncIterable[bytes]) -> AsyncIterator[SSEEvent]:
    """Events from an async iterable of byte pieces, each yielded as soon as it is complete."""
    parser = SSEParser()
    async for piece in pieces:
        for event in parser.feed(piece):
            yield event
    parser.close()
