"""The proxy core over a local socket that replays real servers' bytes: events as they arrive,
the three timeouts, error statuses, cancellation, keep-alive, the request bodies each plugin
sends, the catalogue and tokenization calls. No engine needed; each test runs in well under a
second."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from plugins.contract.capabilities import check_capabilities
from plugins.contract.errors import ContextLengthExceeded, InvalidRequest, UpstreamError
from plugins.contract.protocol import Finish, RequestSpec, Sampling, TextDelta, TokenizeRequest, Usage
from plugins.proxy.backend import ProxyBackend
from plugins.proxy.gbnf import choice_grammar
from plugins.proxy.llamacpp import LlamaCppBackend, LlamaCppOptions
from plugins.proxy.openai_compatible import OpenAICompatibleBackend, OpenAICompatibleOptions
from plugins.proxy.options import TimeoutOptions
from plugins.proxy.vllm import VLLMBackend, VLLMOptions
from tests.plugins.proxy.replay import Handler, Received, ReplayServer, http_head, replay, write_recording
from tests.support.recordings import Recording, find

MESSAGES = [{"role": "user", "content": "hi"}]


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]


def spec(**kw: Any) -> RequestSpec:
    sampling = kw.pop("sampling", Sampling())
    base: dict[str, Any] = dict(request_id="req-1", kind="chat", model="public", upstream_model="public",
                                sampling=sampling, messages=MESSAGES, stream=True)
    base.update(kw)
    return RequestSpec(**base)


def by_event(rec: Recording) -> Recording:
    """The same real bytes, re-cut into one network piece per SSE event."""
    parts = [p + b"\n\n" for p in rec.body.split(b"\n\n") if p.strip()]
    return Recording(engine=rec.engine, name=rec.name, status=rec.status, content_type=rec.content_type,
                     body=b"".join(parts), chunks=parts, request=rec.request, path=rec.path)


def vllm(url: str, **kw: Any) -> VLLMBackend:
    return VLLMBackend("v", VLLMOptions(base_url=url, **kw))


def llamacpp(url: str, **kw: Any) -> LlamaCppBackend:
    return LlamaCppBackend("l", LlamaCppOptions(base_url=url, **kw))


async def collect(backend: ProxyBackend, s: RequestSpec) -> list:
    try:
        return [e async for e in backend.generate(s)]
    finally:
        await backend.close()


# -- streaming ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("engine", "name"), [("vllm", "05_chat_stream_include_usage"), ("llamacpp", "05_chat_stream_usage")])
def test_generate_replayed_stream(engine: str, name: str) -> None:
    rec = by_event(find(engine, name))

    async def main() -> list:
        async with ReplayServer(handler=replay(rec)) as server:
            backend = vllm(server.url) if engine == "vllm" else llamacpp(server.url)
            return await collect(backend, spec())

    events = run(main())
    assert isinstance(events[-1], Usage) and isinstance(events[-2], Finish)
    assert all(e.text for e in events if isinstance(e, TextDelta))
    assert sum(isinstance(e, Usage) for e in events) == 1


def test_each_event_is_yielded_before_the_next_bytes_arrive() -> None:
    rec = by_event(find("vllm", "05_chat_stream_include_usage"))
    release = asyncio.Event()

    async def main() -> None:
        async with ReplayServer(handler=replay(rec, pause_after=2, release=release)) as server:
            backend = vllm(server.url)
            gen = backend.generate(spec())
            first = await asyncio.wait_for(gen.__anext__(), 3)  # sent: role chunk + 1 text chunk
            assert isinstance(first, TextDelta)
            release.set()
            rest = [e async for e in gen]
            assert isinstance(rest[-1], Usage)
            await backend.close()

    run(main())


def test_first_byte_timeout() -> None:
    async def silent(received: Received, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(5)
        return False

    async def main() -> float:
        async with ReplayServer(handler=silent) as server:
            backend = vllm(server.url, timeouts=TimeoutOptions(first_byte_s=0.4))
            started = time.monotonic()
            with pytest.raises(UpstreamError) as info:
                await collect(backend, spec())
            assert info.value.kind == "timeout"
            return time.monotonic() - started

    assert run(main()) < 2


def test_idle_timeout_mid_stream() -> None:
    rec = by_event(find("llamacpp", "05_chat_stream_usage"))
    never = asyncio.Event()

    async def main() -> list:
        async with ReplayServer(handler=replay(rec, pause_after=3, release=never)) as server:
            backend = llamacpp(server.url, timeouts=TimeoutOptions(idle_s=0.3, first_byte_s=5))
            got: list = []
            with pytest.raises(UpstreamError, match="stalled") as info:
                async for event in backend.generate(spec()):
                    got.append(event)
            assert info.value.kind == "timeout"
            await backend.close()
            return got

    got = run(main())
    assert [type(e) for e in got] == [TextDelta, TextDelta]  # what arrived before the stall came through


def test_connect_error_is_bad_gateway() -> None:
    from engines.launch import free_port

    async def main() -> None:
        backend = vllm(f"http://127.0.0.1:{free_port()}")
        with pytest.raises(UpstreamError) as info:
            await collect(backend, spec())
        assert info.value.kind == "bad_gateway"
        assert not await backend.health()

    run(main())


def status_handler(status: int, body: bytes) -> Callable[[Received, asyncio.StreamWriter], Awaitable[bool]]:
    async def handler(received: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(http_head(status, "application/json", chunked=False, length=len(body)) + body)
        await writer.drain()
        return True

    return handler


@pytest.mark.parametrize(
    ("status", "body", "check"),
    [
        (429, b'{"error":{"message":"too many","type":"rate_limit_error","code":429}}',
         lambda e: isinstance(e, UpstreamError) and e.kind == "rate_limited"),
        (503, b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}',
         lambda e: isinstance(e, UpstreamError) and e.kind == "unavailable" and e.message == "Loading model"),
        (500, b"oops", lambda e: isinstance(e, UpstreamError) and e.kind == "upstream_status" and e.upstream_status == 500),
    ],
)
def test_error_statuses(status: int, body: bytes, check: Callable[[Exception], bool]) -> None:
    async def main() -> None:
        async with ReplayServer(handler=status_handler(status, body)) as server:
            with pytest.raises(Exception) as info:
                await collect(llamacpp(server.url), spec())
            assert check(info.value), info.value

    run(main())


@pytest.mark.parametrize(("engine", "name"), [("vllm", "16b_prompt_too_long_stream"), ("llamacpp", "10b_prompt_too_long_stream")])
def test_context_overflow_before_any_event(engine: str, name: str) -> None:
    rec = find(engine, name)

    async def main() -> None:
        async with ReplayServer(handler=replay(rec)) as server:
            backend = vllm(server.url) if engine == "vllm" else llamacpp(server.url)
            with pytest.raises(ContextLengthExceeded):
                await collect(backend, spec())

    run(main())


def test_closing_the_iterator_closes_the_upstream_connection() -> None:
    rec = by_event(find("vllm", "05_chat_stream_include_usage"))
    never = asyncio.Event()

    async def main() -> None:
        async with ReplayServer(handler=replay(rec, pause_after=3, release=never)) as server:
            backend = vllm(server.url)
            gen = backend.generate(spec())
            assert isinstance(await gen.__anext__(), TextDelta)
            assert not server.hung_up.is_set()
            await gen.aclose()  # what the gateway does when the client goes away
            await asyncio.wait_for(server.hung_up.wait(), 2)
            await backend.close()

    run(main())


def _connections_for_three_streams(handler: Handler) -> int:
    async def main() -> int:
        async with ReplayServer(handler=handler) as server:
            backend = llamacpp(server.url)
            for _ in range(3):
                events = [e async for e in backend.generate(spec())]
                assert isinstance(events[-1], Usage)
            await backend.close()
            return server.connections

    return run(main())


def test_keep_alive_reuses_one_connection() -> None:
    assert _connections_for_three_streams(replay(by_event(find("llamacpp", "05_chat_stream_usage")))) == 1


@pytest.mark.parametrize("terminator_later", [False, True], ids=["with-done", "after-done"])
def test_the_connection_is_kept_whether_the_body_ended_with_done_or_after_it(terminator_later: bool) -> None:
    """`[DONE]` ends the events; the body's end (the chunked terminator) came in the same read,
    or comes later and is waited for (drained): either way the connection goes back to the pool."""
    rec = by_event(find("llamacpp", "05_chat_stream_usage"))

    async def handler(received: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(http_head(200, "text/event-stream", chunked=True))
        *chunks, done = rec.chunks
        for chunk in chunks:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        writer.write(b"%x\r\n%s\r\n" % (len(done), done))
        if terminator_later:
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    assert _connections_for_three_streams(handler) == 1


# -- request bodies -------------------------------------------------------------------------------


def test_vllm_body_is_explicit_and_forwards_extensions() -> None:
    s = spec(upstream_model="smol", sampling=Sampling(max_tokens=5, stop=("x",), seed=3, min_tokens=1),
             priority=2, structured_outputs={"choice": ["a", "b"]}, include_usage=False)
    body = vllm("http://u", models={"smol": "served-name"}).build_body(s)
    assert body["model"] == "served-name"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    for key, value in {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
                       "presence_penalty": 0.0, "frequency_penalty": 0.0, "n": 1, "max_tokens": 5, "stop": ["x"],
                       "seed": 3, "min_tokens": 1, "priority": 2, "add_generation_prompt": True}.items():
        assert body[key] == value, key
    assert body["structured_outputs"] == {"choice": ["a", "b"]}


def test_llamacpp_body_translates() -> None:
    s = spec(sampling=Sampling(top_k=5, min_p=0.1, repetition_penalty=1.3, temperature=0.5),
             structured_outputs={"choice": ['Pa"ris', "Lyon"]}, chat_template_kwargs={"x": 1})
    body = llamacpp("http://u").build_body(s)
    assert body["top_k"] == 5 and body["min_p"] == 0.1 and body["repeat_penalty"] == 1.3
    assert "repetition_penalty" not in body and "n" not in body
    assert body["temperature"] == 0.5 and body["top_p"] == 1.0
    assert body["typical_p"] == 1.0 and body["dry_multiplier"] == 0.0 and body["mirostat"] == 0
    assert body["grammar"] == 'root ::= "Pa\\"ris" | "Lyon"'
    assert body["chat_template_kwargs"] == {"x": 1}
    defaults = llamacpp("http://u").build_body(spec())
    assert defaults["top_k"] == 0 and defaults["min_p"] == 0.0 and defaults["repeat_penalty"] == 1.0
    assert defaults["temperature"] == 1.0 and defaults["top_p"] == 1.0  # not llama.cpp's 0.8 / 0.95
    js = llamacpp("http://u").build_body(spec(structured_outputs={"json": '{"type": "object"}'}))
    assert js["json_schema"] == {"type": "object"}
    assert llamacpp("http://u").build_body(spec(structured_outputs={"regex": "a+"}))["grammar"] == 'root ::= "a"+'
    with pytest.raises(InvalidRequest, match="regex.*lookahead"):
        llamacpp("http://u").build_body(spec(structured_outputs={"regex": "(?=a)b"}))


def test_choice_grammar_escapes() -> None:
    assert choice_grammar(["a\nb", "c\\d"]) == 'root ::= "a\\nb" | "c\\\\d"'


def test_capabilities_refuse_before_sending() -> None:
    caps = llamacpp("http://u").capabilities()
    with pytest.raises(InvalidRequest, match="`priority` is not supported by backend `l`") as info:
        check_capabilities(spec(priority=1, extensions=frozenset({"priority"})), caps, "l")
    assert info.value.param == "priority"
    with pytest.raises(InvalidRequest, match="at most 1"):
        check_capabilities(spec(sampling=Sampling(n=2)), caps, "l")
    check_capabilities(spec(extensions=frozenset({"top_k", "min_p", "repetition_penalty"})), caps, "l")
    vcaps = vllm("http://u").capabilities()
    check_capabilities(spec(priority=1, extensions=frozenset({"priority", "top_k"}), sampling=Sampling(n=3)), vcaps, "v")
    ocaps = OpenAICompatibleBackend("o", OpenAICompatibleOptions(base_url="http://u")).capabilities()
    with pytest.raises(InvalidRequest, match="top_k"):
        check_capabilities(spec(extensions=frozenset({"top_k"})), ocaps, "o")


def test_openai_compatible_body_has_no_extensions() -> None:
    backend = OpenAICompatibleBackend("o", OpenAICompatibleOptions(base_url="http://u", max_tokens_field="max_completion_tokens"))
    body = backend.build_body(spec(sampling=Sampling(max_tokens=7)))
    assert body["max_completion_tokens"] == 7 and "max_tokens" not in body
    assert not {"top_k", "min_p", "repetition_penalty", "priority"} & set(body)
    with_ext = OpenAICompatibleBackend("o", OpenAICompatibleOptions(base_url="http://u", extensions=["top_k", "min_p"]))
    body = with_ext.build_body(spec(sampling=Sampling(top_k=3), extensions=frozenset({"top_k"})))
    assert body["top_k"] == 3 and body["min_p"] == 0.0


def test_a_body_using_no_extension_is_the_same_bytes_on_a_backend_that_forwards_them() -> None:
    backend = OpenAICompatibleBackend("o", OpenAICompatibleOptions(base_url="http://u", extensions=["top_k", "min_p", "priority"]))
    body = backend.build_body(spec(model="m", upstream_model="m", sampling=Sampling(max_tokens=5, top_k=4), priority=3,
                                   messages=[{"role": "user", "content": "hi"}]))
    assert msgspec.json.encode(body) == (
        b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},'
        b'"n":1,"temperature":1.0,"top_p":1.0,"presence_penalty":0.0,"frequency_penalty":0.0,"max_tokens":5,"top_k":4,'
        b'"min_p":0.0}')


def test_api_key_goes_upstream_only_and_is_never_shown() -> None:
    rec = by_event(find("llamacpp", "05_chat_stream_usage"))

    async def main() -> Received:
        async with ReplayServer(handler=replay(rec)) as server:
            backend = llamacpp(server.url, api_key="sk-secret")
            await collect(backend, spec(request_id="abc"))
            return server.requests[0]

    received = run(main())
    assert received.headers["authorization"] == "Bearer sk-secret"
    assert received.headers["x-request-id"] == "abc"
    assert "sk-secret" not in repr(LlamaCppOptions(base_url="http://u", api_key="sk-secret"))


# -- catalogue and tokens -------------------------------------------------------------------------


def routes(table: dict[str, Recording | dict]) -> Callable[[Received, asyncio.StreamWriter], Awaitable[bool]]:
    async def handler(received: Received, writer: asyncio.StreamWriter) -> bool:
        rec = table[received.path]
        if isinstance(rec, dict):
            body = json.dumps(rec).encode()
            writer.write(http_head(200, "application/json", chunked=False, length=len(body)) + body)
            await writer.drain()
            return True
        return await write_recording(writer, rec)

    return handler


def test_llamacpp_catalogue_uses_props_n_ctx() -> None:
    table = {"/v1/models": find("llamacpp", "02_models"), "/props": find("llamacpp", "13_props"),
             "/health": find("llamacpp", "01_health")}

    async def main() -> None:
        async with ReplayServer(handler=routes(table)) as server:
            backend = llamacpp(server.url)
            await backend.start()
            infos = await backend.models()
            assert [(i.id, i.max_model_len) for i in infos] == [("tiny-llama", 256)]
            assert backend.capabilities().max_model_len == 256
            assert await backend.health()
            mapped = llamacpp(server.url, models={"smol": "tiny-llama"})
            assert [(i.id, i.max_model_len) for i in await mapped.models()] == [("smol", 256)]
            await backend.close()
            await mapped.close()

    run(main())


def test_vllm_catalogue_and_tokens() -> None:
    table = {"/v1/models": find("vllm", "02_models"), "/tokenize": find("vllm", "17b_tokenize_messages"),
             "/detokenize": find("vllm", "44_detokenize"), "/health": find("vllm", "01_health")}

    async def main() -> None:
        async with ReplayServer(handler=routes(table)) as server:
            backend = vllm(server.url)
            infos = await backend.models()
            assert [(i.id, i.max_model_len) for i in infos] == [("models/tiny-llama", 512)]
            result = await backend.tokenize(TokenizeRequest(upstream_model="models/tiny-llama", messages=MESSAGES))
            assert len(result.tokens) == 27 and result.max_model_len == 512
            assert json.loads(server.requests[-1].body)["messages"] == MESSAGES
            assert await backend.detokenize("models/tiny-llama", [45, 530]) == "Hello there"
            rendered = await backend.render("models/tiny-llama", MESSAGES)
            assert rendered.tokens == result.tokens and rendered.text == "Hello there"
            assert await backend.health()
            await backend.close()

    run(main())


def test_llamacpp_tokenize_messages_applies_the_template_first() -> None:
    table = {"/apply-template": {"prompt": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"},
             "/tokenize": {"tokens": [{"id": 1, "piece": "<|im_start|>"}, {"id": 4093, "piece": "user"}]}}

    async def main() -> None:
        async with ReplayServer(handler=routes(table)) as server:
            backend = llamacpp(server.url)
            result = await backend.tokenize(TokenizeRequest(upstream_model="x", messages=MESSAGES, return_token_strs=True))
            assert result.tokens == [1, 4093] and result.token_strs == ["<|im_start|>", "user"]
            sent = [r.path for r in server.requests]
            assert sent == ["/apply-template", "/tokenize"]
            assert json.loads(server.requests[1].body)["content"].startswith("<|im_start|>user")
            rendered = await backend.render("x", MESSAGES)
            assert rendered.text.startswith("<|im_start|>user") and rendered.tokens == [1, 4093]
            await backend.close()

    run(main())


def test_a_connection_closed_without_answer_is_retried_once() -> None:
    rec = by_event(find("llamacpp", "05_chat_stream_usage"))
    calls = {"n": 0}

    async def flaky(received: Received, writer: asyncio.StreamWriter) -> bool:
        calls["n"] += 1
        if calls["n"] == 1:
            return False  # hang up without a response, as a server closing an idle keep-alive does
        return await write_recording(writer, rec)

    async def main() -> int:
        async with ReplayServer(handler=flaky) as server:
            events = await collect(llamacpp(server.url), spec())
            assert isinstance(events[-1], Usage)
            return server.connections

    assert run(main()) == 2


def test_a_server_that_never_answers_twice_is_bad_gateway() -> None:
    async def rude(received: Received, writer: asyncio.StreamWriter) -> bool:
        return False

    async def main() -> None:
        async with ReplayServer(handler=rude) as server:
            with pytest.raises(UpstreamError) as info:
                await collect(llamacpp(server.url), spec())
            assert info.value.kind == "bad_gateway"
            assert len(server.requests) == 2

    run(main())
