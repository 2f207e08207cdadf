"""Property tests of what the proxy backends parse: the SSE parser and the chunk normalizer.

- Any valid event stream, cut into pieces anywhere (inside a CR LF pair, inside a UTF-8
  character), with any of the three line endings and an optional BOM, parses to exactly the
  events it was written from.
- Garbage — arbitrary bytes, or JSON of any shape where a chunk should be — never raises
  anything but the typed error (`plugins.contract.errors.SwitchyardError`, an `UpstreamError` for a
  broken stream), which the gateway turns into a 502 or an error event. Anything else would be
  a 500 before the first byte, or a stream cut without its error event after it.
"""

from __future__ import annotations

import json
import os

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugins.contract.errors import SwitchyardError
from plugins.contract.protocol import RequestSpec, Sampling
from plugins.proxy.normalize import StreamNormalizer
from plugins.transport.sse import SSEEvent, SSEParser

LONG = os.environ.get("SWITCHYARD_LONG") == "1"
EXAMPLES = 2000 if LONG else 200
PROFILE = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# a line's text: anything but line breaks (a data line may be empty, may contain ":" or NUL)
line_text = st.text(st.characters(exclude_characters="\r\n", exclude_categories=["Cs"]), max_size=20)
field_value = st.text(st.characters(exclude_characters="\r\n\x00", exclude_categories=["Cs"]), min_size=1, max_size=10)


@st.composite
def event_streams(draw: st.DrawFn) -> tuple[bytes, list[SSEEvent]]:
    """(the stream's bytes, the events it must parse to)."""
    newline = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    lines: list[str] = []
    events: list[SSEEvent] = []
    last_id: str | None = None
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            lines.append(":" + draw(line_text))  # a comment (keep-alive ping)
        name = draw(st.none() | field_value.filter(lambda v: v.strip() == v))
        if name is not None:
            lines.append("event: " + name)
        event_id = draw(st.none() | field_value)
        if event_id is not None:
            lines.append("id: " + event_id)
            last_id = event_id
        data = draw(st.lists(line_text, min_size=1, max_size=3))
        lines += ["data: " + d for d in data]
        lines.append("")  # the blank line dispatches it
        events.append(SSEEvent("\n".join(data), name or "message", last_id))
    text = newline.join(lines) + (newline if lines else "")
    bom = "\ufeff" if draw(st.booleans()) else ""
    return (bom + text).encode("utf-8"), events


@st.composite
def splits(draw: st.DrawFn, data: bytes) -> list[bytes]:
    cuts = sorted(set(draw(st.lists(st.integers(0, len(data)), max_size=12))))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


def parse(pieces: list[bytes]) -> list[SSEEvent]:
    parser = SSEParser()
    out: list[SSEEvent] = []
    for piece in pieces:
        out += parser.feed(piece)
    out += parser.close()
    return out


@PROFILE
@given(st.data())
def test_any_chunking_of_a_valid_stream_parses_to_the_same_events(data: st.DataObject) -> None:
    raw, expected = data.draw(event_streams())
    assert parse([raw]) == expected
    assert parse(data.draw(splits(raw))) == expected
    assert parse([raw[i : i + 1] for i in range(len(raw))]) == expected


def _spec(kind: str, n: int) -> RequestSpec:
    return RequestSpec(request_id="fuzz", kind=kind, model="m", upstream_model="m", sampling=Sampling(n=n))  # type: ignore[arg-type]


def normalize(pieces: list[bytes], kind: str = "chat", n: int = 1) -> None:
    """What `ProxyBackend.generate` does with a body: parse, normalize, finish."""
    parser = SSEParser()
    norm = StreamNormalizer(kind=kind, n=n, backend="fuzz", spec=_spec(kind, n))
    for piece in pieces:
        for sse in parser.feed(piece):
            norm.feed_data(sse.data)
            if norm.done:
                break
    norm.finish()


def only_typed_errors(fn, *args, **kwargs) -> None:  # noqa: ANN001
    try:
        fn(*args, **kwargs)
    except SwitchyardError:
        pass


@PROFILE
@given(st.binary(max_size=400), st.data())
def test_garbage_bytes_raise_only_the_typed_error(raw: bytes, data: st.DataObject) -> None:
    pieces = data.draw(splits(raw))
    only_typed_errors(parse, pieces)
    only_typed_errors(normalize, pieces)


json_scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=8)
KEYS = [
    "choices", "usage", "error", "timings", "index", "delta", "message", "content", "text", "finish_reason", "logprobs",
    "tool_calls", "function", "name", "arguments", "id", "prompt_tokens", "completion_tokens", "prompt_tokens_details",
    "cached_tokens", "cache_n", "tokens", "token_logprobs", "top_logprobs", "token", "logprob", "bytes", "code", "type",
]
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=5),
    max_leaves=25,
)
chunk_like = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=5)


@PROFILE
@given(st.lists(chunk_like | json_values, min_size=1, max_size=4), st.sampled_from(["chat", "completion"]), st.integers(1, 2))
def test_chunks_of_any_shape_raise_only_the_typed_error(chunks: list, kind: str, n: int) -> None:
    body = b"".join(b"data: " + msgspec.json.encode(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    only_typed_errors(normalize, [body], kind, n)


def test_a_well_formed_chunk_still_normalizes() -> None:
    """The guard against odd shapes leaves the normal path alone."""
    chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
    norm = StreamNormalizer(kind="chat", n=1, backend="fuzz", spec=_spec("chat", 1))
    events = norm.feed_data(json.dumps(chunk))
    assert [type(e).__name__ for e in events] == ["TextDelta", "Finish"]
    assert norm.finish().prompt_tokens == 3
