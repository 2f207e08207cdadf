"""Upstream chunks → protocol events, and upstream errors → the gateway's typed errors, on what
real vLLM and llama.cpp servers sent (tests/recordings)."""

from __future__ import annotations

import json
import re

import msgspec
import pytest

from gateway.errors import error_payload
from plugins.contract.errors import ContextLengthExceeded, InvalidRequest, ModelNotFound, SwitchyardError, UpstreamError
from plugins.contract.protocol import Finish, RequestSpec, Sampling, TextDelta, ToolCallDelta, Usage
from plugins.proxy.errors import error_from_body, map_upstream_error
from plugins.proxy.normalize import StreamNormalizer
from plugins.transport.sse import SSEParser
from tests.support.recordings import Recording, all_recordings, find, recorded

ALL = all_recordings()
STREAMS = [r for r in ALL if r.is_sse and r.status == 200 and r.path.endswith("completions")]


def _n(rec: Recording) -> int:
    return (rec.request or {}).get("n") or 1


def _asked_usage(rec: Recording) -> bool:
    req = rec.request or {}
    return bool((req.get("stream_options") or {}).get("include_usage")) or rec.kind == "completion" and rec.engine == "llamacpp"


def _spec(rec: Recording) -> RequestSpec:
    return RequestSpec(request_id="t", kind=rec.kind, model="public-name", upstream_model="x",  # type: ignore[arg-type]
                       sampling=Sampling(n=_n(rec)))


def normalize(rec: Recording) -> tuple[list, StreamNormalizer]:
    norm = StreamNormalizer(kind=rec.kind, n=_n(rec), backend="b", spec=_spec(rec))
    parser = SSEParser()
    events = []
    for piece in rec.chunks:
        for sse in parser.feed(piece):
            events += norm.feed_data(sse.data)
    return events, norm


def _upstream_texts(rec: Recording) -> dict[int, str]:
    texts: dict[int, str] = {}
    for sse in SSEParser().feed(rec.body):
        if sse.data == "[DONE]":
            continue
        for choice in json.loads(sse.data).get("choices") or ():
            part = (choice.get("delta") or {}).get("content") if rec.kind == "chat" else choice.get("text")
            texts[choice["index"]] = texts.get(choice["index"], "") + (part or "")
    return texts


@pytest.mark.parametrize("rec", [r for r in STREAMS if "error" not in r.body.decode()[:300]], ids=lambda r: r.id)
def test_stream_normalizes(rec: Recording) -> None:
    events, norm = normalize(rec)
    assert norm.done
    n = _n(rec)
    # no empty deltas; nothing of a choice after its Finish; exactly one Finish per choice
    finished: set[int] = set()
    for event in events:
        assert isinstance(event, (TextDelta, ToolCallDelta, Finish))
        assert event.index not in finished
        if isinstance(event, TextDelta):
            assert event.text or event.logprobs
        if isinstance(event, Finish):
            finished.add(event.index)
            assert event.reason in ("stop", "length", "tool_calls")
    assert finished == set(range(n))
    # the text is exactly what the upstream sent (role chunk "" / null dropped)
    for index, text in _upstream_texts(rec).items():
        assert "".join(e.text for e in events if isinstance(e, TextDelta) and e.index == index) == text
    if rec.request is None:  # a raw body without its request: usage only if it came
        asked = norm.usage is not None
    else:
        asked = _asked_usage(rec)
    if asked:
        usage = norm.finish()
        assert isinstance(usage, Usage)
        assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    else:
        with pytest.raises(UpstreamError, match="no usage"):
            norm.finish()


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_length_finish_and_usage(engine: str) -> None:
    events, norm = normalize(find(engine, "chat_stream_length"))
    assert [e for e in events if isinstance(e, Finish)] == [Finish(reason="length")]
    usage = norm.finish()
    assert usage.completion_tokens == 3
    assert usage.cached_tokens is not None  # both report it (vLLM: --enable-prompt-tokens-details)


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_stop_finish(engine: str) -> None:
    events, norm = normalize(find(engine, "chat_stream"))
    assert events[-1] == Finish(reason="stop")
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert "Paris" in text
    assert norm.finish().prompt_tokens == 27  # the France question with its system prompt, as transformers counts


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_repeated_prompt_reports_cached_tokens(engine: str) -> None:
    _, first = normalize(find(engine, "chat_cached_first"))
    _, second = normalize(find(engine, "chat_cached_second"))
    assert second.finish().prompt_tokens >= 128
    assert second.finish().cached_tokens > 0
    assert first.finish().cached_tokens is not None


def test_llamacpp_cached_tokens_equal_timings_cache_n() -> None:
    rec = find("llamacpp", "chat_cached_second")
    last_usage = [json.loads(e.data) for e in SSEParser().feed(rec.body) if '"usage"' in e.data][-1]
    _, norm = normalize(rec)
    assert norm.finish().cached_tokens == last_usage["timings"]["cache_n"]
    # a build without prompt_tokens_details: timings.cache_n is used
    del last_usage["usage"]["prompt_tokens_details"]
    norm2 = StreamNormalizer(kind="chat", n=1, backend="b")
    norm2.feed(last_usage)
    assert norm2.usage.cached_tokens == last_usage["timings"]["cache_n"]


def test_vllm_text_on_the_finish_chunk_comes_before_finish() -> None:
    events, _ = normalize(find("vllm", "07c_prefix_cache_stream_usage"))
    assert isinstance(events[-2], TextDelta) and events[-2].text == "uct"
    assert events[-1] == Finish(reason="length")


def test_vllm_n2_interleaved() -> None:
    events, norm = normalize(find("vllm", "20_stream_n2"))
    assert sorted(e.index for e in events if isinstance(e, Finish)) == [0, 1]
    assert norm.finish().completion_tokens == 6


def test_logprobs_are_mapped() -> None:
    for engine in ("vllm", "llamacpp"):
        events, _ = normalize(find(engine, "chat_stream_logprobs"))
        deltas = [e for e in events if isinstance(e, TextDelta)]
        assert deltas and all(d.logprobs for d in deltas), engine
        assert all(len(lp.top_logprobs) == 2 for d in deltas for lp in d.logprobs), engine


def test_completion_streams() -> None:
    for engine in ("vllm", "llamacpp"):
        events, norm = normalize(find(engine, "completion_stream"))
        assert any(isinstance(e, TextDelta) for e in events)
        assert isinstance(events[-1], Finish)
        assert norm.finish().completion_tokens > 0


# -- errors ---------------------------------------------------------------------------------------


def _error(rec: Recording) -> SwitchyardError:
    return error_from_body(rec.status, rec.body, backend="b", spec=_spec(rec))


@pytest.mark.parametrize("rec", [r for r in recorded() if r.name == "chat_prompt_too_long"]
                         + [find("vllm", "16_prompt_too_long"), find("vllm", "16b_prompt_too_long_stream"),
                            find("llamacpp", "10_prompt_too_long"), find("llamacpp", "10b_prompt_too_long_stream")],
                         ids=lambda r: r.id)
def test_prompt_too_long_is_context_length_exceeded(rec: Recording) -> None:
    assert rec.status == 400 and not rec.is_sse  # plain JSON even when streaming
    error = _error(rec)
    assert isinstance(error, ContextLengthExceeded)
    assert error.param == "messages"
    upstream_message = json.loads(rec.body)["error"]["message"]
    assert error.message == upstream_message
    status, payload = error_payload(error)
    assert status == 400 and payload.error.code == "context_length_exceeded"
    assert payload.error.type == "invalid_request_error"


@pytest.mark.parametrize("rec", [r for r in recorded() if r.name == "chat_prompt_too_long"]
                         + [find("vllm", "16_prompt_too_long"), find("llamacpp", "10_prompt_too_long")],
                         ids=lambda r: r.id)
def test_the_overflow_carries_the_numbers_the_upstream_told(rec: Recording) -> None:
    """llama.cpp's `n_prompt_tokens` / `n_ctx`; vLLM's context and prompt (its `value`) in words;
    the client sees OpenAI's wording of them."""
    error = _error(rec)
    assert isinstance(error, ContextLengthExceeded)
    told = json.loads(rec.body)["error"]
    if "n_ctx" in told:
        assert (error.prompt_tokens, error.max_model_len) == (told["n_prompt_tokens"], told["n_ctx"])
    else:
        assert error.prompt_tokens == int(re.search(r"value=(\d+)", told["message"])[1])
        assert error.max_model_len is not None and f"context length is {error.max_model_len} tokens" in told["message"]
    assert error.prompt_tokens > error.max_model_len
    assert error_payload(error)[1].error.message == (
        f"This model's maximum context length is {error.max_model_len} tokens. However, your messages resulted in "
        f"{error.prompt_tokens} tokens. Please reduce the length of the messages.")


def test_vllm_max_tokens_over_context() -> None:
    rec = find("vllm", "16c_max_tokens_over_ctx")
    error = _error(rec)
    assert isinstance(error, ContextLengthExceeded) and error.param == "max_tokens"
    assert (error.prompt_tokens, error.max_model_len, error.max_tokens) == (None, 512, 100000)
    assert error_payload(error)[1].error.message == json.loads(rec.body)["error"]["message"]  # too little for OpenAI's


def test_vllm_error_inside_a_200_stream() -> None:
    for rec in (find("vllm", "35_bad_json_schema_stream"), find("vllm", "error_bad_json_schema_stream")):
        assert rec.status == 200 and rec.is_sse
        with pytest.raises(InvalidRequest) as info:
            normalize(rec)
        assert error_payload(info.value)[0] == 400


def test_vllm_integer_code_and_class_like_type() -> None:
    error = _error(find("vllm", "14_temperature_negative"))
    assert type(error) is InvalidRequest and error.param == "temperature"
    status, payload = error_payload(error)
    assert status == 400 and payload.error.type == "invalid_request_error" and payload.error.code is None
    pydantic = _error(find("vllm", "13_missing_messages"))  # type "Bad Request", param "body.messages"
    assert type(pydantic) is InvalidRequest and pydantic.param == "messages"
    assert isinstance(_error(find("vllm", "error_unknown_model")), ModelNotFound)


def test_llamacpp_missing_param_and_types() -> None:
    error = _error(find("llamacpp", "18_n_2"))  # build b11434 with one slot
    assert type(error) is InvalidRequest and error.param is None
    assert "'n'" in error.message
    assert type(_error(find("llamacpp", "33_bad_type_temperature"))) is InvalidRequest


@pytest.mark.parametrize(
    ("status", "body", "kind", "http"),
    [
        (429, b'{"error":{"message":"slow down","type":"rate_limit_error","code":429}}', "rate_limited", 429),
        (503, b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}', "unavailable", 503),
        (500, b'{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}', "upstream_status", 500),
        (502, b"<html>bad gateway</html>", "upstream_status", 502),
        (401, b'{"error":"Unauthorized"}', "bad_gateway", 502),
    ],
)
def test_status_kinds(status: int, body: bytes, kind: str, http: int) -> None:
    error = error_from_body(status, body, backend="b")
    assert isinstance(error, UpstreamError) and error.kind == kind
    assert error_payload(error)[0] == http


def test_message_is_kept() -> None:
    error = map_upstream_error(500, {"error": {"message": "engine died", "type": "x"}}, backend="b")
    assert error.message == "engine died"


@pytest.mark.parametrize("rec", STREAMS, ids=lambda r: r.id)
def test_raw_data_bytes_normalize_as_their_text(rec: Recording) -> None:
    """The proxy's fast path (`SSEParser.whole_data`, the event data as UTF-8 bytes) gives the
    events (or the error) the text path gives, for every recorded stream as its pieces arrived."""

    def run(raw: bool) -> tuple[list, str | None]:
        norm = StreamNormalizer(kind=rec.kind, n=_n(rec), backend="b", spec=_spec(rec))
        parser = SSEParser()
        events: list = []
        try:
            for piece in rec.chunks:
                datas = parser.whole_data(piece) if raw else None
                if datas is None:
                    datas = [sse.data for sse in parser.feed(piece)]
                for data in datas:
                    events += norm.feed_data(data)
        except SwitchyardError as exc:
            return events, f"{type(exc).__name__}: {exc.message}"
        return events, None

    assert run(raw=True) == run(raw=False)


def test_raw_data_bytes_errors_read_as_their_text() -> None:
    """Bad UTF-8 is replaced as the SSE rules say (then decoded), and bytes that are not JSON
    fail with the same message as their text."""
    parser = SSEParser()
    datas = parser.whole_data(b'data: {"choices":[{"index":0,"delta":{"content":"a\xffb"}}]}\n\n')
    assert datas == [b'{"choices":[{"index":0,"delta":{"content":"a\xffb"}}]}']
    norm = StreamNormalizer(kind="chat", n=1, backend="b")
    assert norm.feed_data(datas[0]) == [TextDelta(text="a\ufffdb", index=0)]
    messages = []
    for data in (b"not json \xff", "not json \ufffd"):
        with pytest.raises(UpstreamError) as info:
            StreamNormalizer(kind="chat", n=1, backend="b").feed_data(data)
        messages.append(info.value.message)
    assert messages[0] == messages[1]
    assert parser.whole_data(b"data: x\r\n\r\n") is None and parser.whole_data(b"event: e\ndata: x\n\n") is None


ODD_CHUNKS = [
    '{"choices":[{"index":0,"delta":{},"message":{"content":"m"}}]}',
    '{"choices":[{"index":0,"delta":{"content":"d"},"message":{"content":"m"}}]}',
    '{"choices":[{"index":0,"delta":{"content":null},"message":{"content":"m"}}]}',
    '{"choices":[{"index":0,"delta":null}]}', '{"choices":[{"index":0}]}', '{"choices":[]}', '{}',
    '{"choices":[{"index":"0","delta":{"content":"x"}}]}', '{"choices":[{"index":null,"delta":{"content":"x"}}]}',
    '{"choices":[{"index":true,"delta":{"content":"x"}}]}', '{"choices":[{"index":5,"delta":{"content":"x"}}]}',
    '{"choices":[{"index":[0],"delta":{"content":"x"}}]}', '{"choices":[{"delta":{"content":"no index"}}]}',
    '{"choices":{"a":1}}', '{"choices":"abc"}', '{"choices":[1]}', '{"choices":null}',
    '{"choices":[{"delta":"x"}]}', '{"choices":[{"delta":[]}]}', '{"choices":[{"delta":{"content":5}}]}',
    '{"choices":[{"delta":{"content":""}}]}',
    '{"error":{"message":"boom","code":503}}', '{"error":null}', '{"error":"x","choices":[]}',
    '{"error":"x","choices":[{"delta":{"content":"a"}}]}', '[1,2]', '"str"', '5', 'null', '{"choices":[{}]',
    '{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop","stop_reason":"END"}]}',
    '{"choices":[{"index":0,"delta":{},"finish_reason":"stop","stop_reason":7}],"__verbose":'
    '{"stop_type":"word","stopping_word":"##"}}',
    '{"choices":[{"index":0,"delta":{},"finish_reason":"abort"}]}', '{"choices":[{"delta":{},"finish_reason":["x"]}]}',
    '{"choices":[{"delta":{},"finish_reason":"length"}]}', '{"choices":[{"delta":{},"finish_reason":"weird"}]}',
    '{"choices":[{"delta":{},"finish_reason":""}]}',
    '{"choices":[{"delta":{"content":"a"},"logprobs":{"content":[{"token":"a","logprob":-1,"top_logprobs":[]}]}}]}',
    '{"choices":[{"delta":{"content":"a"},"logprobs":{"content":[1]}}]}', '{"choices":[{"delta":{},"logprobs":"x"}]}',
    '{"choices":[{"delta":{"reasoning":"r"}}]}', '{"choices":[{"delta":{"reasoning_content":"r2"}}]}',
    '{"choices":[{"delta":{"reasoning":"","reasoning_content":"r3"}}]}', '{"choices":[{"delta":{"reasoning":5}}]}',
    '{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"f","arguments":"{}"}}]}}]}',
    '{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":{"a":1}}}]}}]}',
    '{"choices":[{"delta":{"tool_calls":{"x":1}}}]}', '{"choices":[{"delta":{"tool_calls":[]}}]}',
    '{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2},"timings":{"cache_n":1}}',
    '{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":2},'
    '"completion_tokens_details":{"reasoning_tokens":1}}}',
    '{"choices":[],"usage":"x"}', '{"choices":[],"usage":{"prompt_tokens":"x"}}', '{"usage":null}',
    '{"choices":[{"index":0,"text":"t","finish_reason":null}]}', '{"choices":[{"text":5}]}',
    '{"choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{},"message":{"content":"m"}}]}',
    '{"choices":[{"index":0,"delta":{"content":"a"}}],"choices":[]}',
]


def _outcome(norm: StreamNormalizer, feed, data) -> tuple:
    try:
        events = [msgspec.structs.replace(e, id="call_made_up") if isinstance(e, ToolCallDelta) and e.id
                  and e.id.startswith("call_") and e.id.encode() not in data else e for e in feed(data)]
    except SwitchyardError as exc:
        events = f"{type(exc).__name__}: {exc.message}"
    return events, set(norm.finished), norm.usage, norm.done, dict(norm.tool_named)


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("data", ODD_CHUNKS + [b'{"id":"\xff","choices":[{"delta":{"content":"a\xffb"},"text":"\xff"}]}'])
def test_chunks_read_as_attributes_or_as_dicts_normalize_alike(kind: str, data: str | bytes) -> None:
    """`feed_data` reads a chunk of the usual shape straight into attributes (`_Chunk`), anything
    else as a dict: both give the same events, errors and state, whatever the chunk holds."""
    spec = RequestSpec(request_id="t", kind=kind, model="m", upstream_model="m",  # type: ignore[arg-type]
                       sampling=Sampling(n=2), continuous_usage_stats=True)
    outcomes = []
    for read_as_dict in (False, True):
        norm = StreamNormalizer(kind=kind, n=2, backend="b", spec=spec)
        feed = norm._feed_json if read_as_dict else norm.feed_data
        outcomes.append(_outcome(norm, feed, data.encode() if isinstance(data, str) else data))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("rec", STREAMS, ids=lambda r: r.id)
def test_recorded_streams_read_as_attributes_or_as_dicts_normalize_alike(rec: Recording) -> None:
    outcomes = []
    for read_as_dict in (False, True):
        norm = StreamNormalizer(kind=rec.kind, n=_n(rec), backend="b", spec=_spec(rec))
        feed = norm._feed_json if read_as_dict else norm.feed_data
        outcomes.append([_outcome(norm, feed, sse.data.encode()) for sse in SSEParser().feed(rec.body)
                         if sse.data != "[DONE]"])
    assert outcomes[0] == outcomes[1]


PLAIN_TOKENS = [
    '{"choices":[{"index":0,"delta":{"content":"x"}}]}',
    '{"id":"c","object":"chat.completion.chunk","choices":[{"index":1,"delta":{"content":" é\\u00e9 \\"q\\""},'
    '"logprobs":null,"finish_reason":null}],"usage":null}',
    '{"choices":[{"index":0,"delta":{"role":"assistant","content":"r"},"finish_reason":null,"stop_reason":null}]}',
    '{"choices":[{"index":0,"text":"t","finish_reason":null}]}', '{"choices":[{"index":-1,"text":"t"}]}',
    '{"choices":[{"index":0,"delta":{"content":"a"},"text":"b"}]}',
    '{"choices":[{"index":0,"delta":{"content":"a"}}],"__verbose":{"stop_type":"word"}}',
    '{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":""}]}',
]


def _plain_or_general(kind: str, data: bytes, *, finished: set[int], content_calls=None) -> None:
    """`plain_token(data)` is None, or `(index, text)` where `feed_data(data)` gives exactly
    `[TextDelta(text=text, index=index)]` and leaves the normalizer as it was."""
    spec = RequestSpec(request_id="t", kind=kind, model="m", upstream_model="m",  # type: ignore[arg-type]
                       sampling=Sampling(n=2), continuous_usage_stats=True)
    norm = StreamNormalizer(kind=kind, n=2, backend="b", spec=spec, content_calls=content_calls)
    norm.finished |= finished
    token = norm.plain_token(data)
    if token is None:
        return None
    before = (set(norm.finished), norm.usage, norm.done, dict(norm.tool_named), dict(norm.content_parsers))
    assert norm.feed_data(data) == [TextDelta(text=token[1], index=token[0])]
    assert (set(norm.finished), norm.usage, norm.done, dict(norm.tool_named), dict(norm.content_parsers)) == before
    return token


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("data", ODD_CHUNKS + PLAIN_TOKENS + [b'{"choices":[{"delta":{"content":"a\xffb"},"text":"\xff"}]}',
                                                             "[DONE]", "", " {}"])
def test_a_plain_token_is_what_feed_data_gives(kind: str, data: str | bytes) -> None:
    """The proxies' short path for a plain token (`plain_token`) answers only where `feed_data`
    gives one text delta and nothing else, whatever the chunk holds, and then the same delta."""
    raw = data.encode() if isinstance(data, str) else data
    for finished in (set(), {0}, {1}):
        _plain_or_general(kind, raw, finished=finished)
    assert _plain_or_general(kind, raw, finished=set(), content_calls=lambda: None) is None


def test_plain_tokens_take_the_short_path() -> None:
    tokens = [_plain_or_general(kind, data.encode(), finished=set())
              for kind in ("chat", "completion") for data in PLAIN_TOKENS]
    assert tokens == [(0, "x"), (1, ' éé "q"'), (0, "r"), None, None, (0, "a"), (0, "a"), (0, "a"),
                      None, None, None, (0, "t"), (-1, "t"), (0, "b"), None, None]


@pytest.mark.parametrize("rec", STREAMS, ids=lambda r: r.id)
def test_recorded_plain_tokens_are_what_feed_data_gives(rec: Recording) -> None:
    """Every chunk of every recorded vLLM and llama.cpp stream, read on by `feed_data` as the
    proxy does: where `plain_token` answers, `feed_data` gives that one delta; and it answers
    for the tokens of every stream that has plain text."""
    norm = StreamNormalizer(kind=rec.kind, n=_n(rec), backend="b", spec=_spec(rec))
    plain = 0
    try:
        for sse in SSEParser().feed(rec.body):
            data = sse.data.encode()
            token = norm.plain_token(data)
            events = norm.feed_data(data)
            if token is not None:
                plain += 1
                assert events == [TextDelta(text=token[1], index=token[0])]
    except SwitchyardError:
        return
    texts = [e for e in normalize(rec)[0] if isinstance(e, TextDelta) and e.logprobs is None]
    usage_on_every_chunk = ((rec.request or {}).get("stream_options") or {}).get("continuous_usage_stats")
    assert plain or usage_on_every_chunk or len(texts) <= 1  # (a text that comes only with its finish is no plain token)
