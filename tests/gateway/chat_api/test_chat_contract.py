"""The chat contract through the official `openai` client, sync and async, against a real server.

The echo backend answers with the last message's words, one per token, so every text, token
count and finish reason below is predictable: for `user("hello big world")` the answer is
"hello big world", the prompt is 4 tokens (a role marker plus 3 words), the completion 3, and
the backend reports half the prompt (2) as cached.
"""

from __future__ import annotations

import asyncio

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.gateway.helpers import user

TEXT = "hello big world"
WORDS = TEXT.split()
PROMPT_TOKENS = 1 + len(WORDS)


def check_completion(resp: ChatCompletion, *, model: str = "echo-1") -> None:
    assert resp.object == "chat.completion"
    assert resp.id.startswith("chatcmpl-") and len(resp.id) > len("chatcmpl-")
    assert resp.model == model
    assert isinstance(resp.created, int) and resp.created > 1_600_000_000
    assert resp.system_fingerprint == "fp_switchyard"
    assert len(resp.choices) == 1
    choice = resp.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert choice.message.content == TEXT
    assert choice.finish_reason == "stop"
    assert choice.logprobs is None
    usage = resp.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (PROMPT_TOKENS, len(WORDS))
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == PROMPT_TOKENS // 2


def check_stream(chunks: list[ChatCompletionChunk], *, n: int = 1, text: str = TEXT, finish: str = "stop") -> None:
    """The stream rules of the contract, per choice, without include_usage."""
    assert chunks, "no chunks"
    ids = {c.id for c in chunks}
    assert len(ids) == 1 and next(iter(ids)).startswith("chatcmpl-")
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert all(c.model == "echo-1" for c in chunks)
    assert all(c.usage is None for c in chunks)
    for index in range(n):
        mine = [(c, ch) for c in chunks for ch in c.choices if ch.index == index]
        first_chunk, first = mine[0]
        assert first.delta.role == "assistant" and first.delta.content == ""
        assert first.finish_reason is None
        rest = mine[1:]
        assert rest, f"choice {index} has only its role chunk"
        assert all(ch.delta.role is None for _, ch in rest), "role repeated after the first chunk"
        assert all(ch.delta.content for _, ch in rest), "empty content delta"
        finishes = [ch.finish_reason for _, ch in mine if ch.finish_reason is not None]
        assert finishes == [finish], finishes
        assert rest[-1][1].finish_reason == finish, "finish_reason must ride on the last content chunk"
        assert "".join(ch.delta.content for _, ch in rest) == text


# -- non-streaming -------------------------------------------------------------------------------


def test_chat_sync(client: openai.OpenAI) -> None:
    check_completion(client.chat.completions.create(model="echo-1", messages=user(TEXT)))


@pytest.mark.anyio
async def test_chat_async(aclient: openai.AsyncOpenAI) -> None:
    check_completion(await aclient.chat.completions.create(model="echo-1", messages=user(TEXT)))


def test_ids_differ_per_request(client: openai.OpenAI) -> None:
    a = client.chat.completions.create(model="echo-1", messages=user(TEXT))
    b = client.chat.completions.create(model="echo-1", messages=user(TEXT))
    assert a.id != b.id


def test_multi_turn_answers_last_message_and_counts_every_message(client: openai.OpenAI) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": [{"type": "text", "text": "three four"}]},
    ]
    resp = client.chat.completions.create(model="echo-1", messages=messages)
    assert resp.choices[0].message.content == "three four"
    # 4 role markers + 2 + 1 + 1 + 2 words
    assert resp.usage.prompt_tokens == 4 + 6


def test_max_tokens_gives_length(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model="echo-1", messages=user(TEXT), max_tokens=2)
    assert resp.choices[0].message.content == "hello big"
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 2


def test_max_completion_tokens_wins_over_max_tokens(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model="echo-1", messages=user(TEXT), max_tokens=3, max_completion_tokens=1)
    assert resp.choices[0].message.content == "hello"
    assert resp.choices[0].finish_reason == "length"


def test_stop_string(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model="echo-1", messages=user(TEXT), stop=["big"])
    assert resp.choices[0].message.content == "hello"
    assert resp.choices[0].finish_reason == "stop"
    resp = client.chat.completions.create(model="echo-1", messages=user(TEXT), stop="world")
    assert resp.choices[0].message.content == "hello big"


def test_n_two_choices(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model="echo-1", messages=user(TEXT), n=2)
    assert [c.index for c in resp.choices] == [0, 1]
    assert all(c.message.content == TEXT and c.finish_reason == "stop" for c in resp.choices)
    assert resp.usage.completion_tokens == 2 * len(WORDS)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_logprobs_shape(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model="echo-1", messages=user(TEXT), logprobs=True, top_logprobs=3)
    logprobs = resp.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert len(logprobs.content) == len(WORDS)
    assert "".join(t.token for t in logprobs.content) == TEXT
    for item in logprobs.content:
        assert isinstance(item.logprob, float) and item.logprob <= 0
        assert item.bytes == list(item.token.encode())
        assert len(item.top_logprobs) == 3
        assert all(isinstance(t.logprob, float) and t.token for t in item.top_logprobs)
    raw = client.chat.completions.with_raw_response.create(model="echo-1", messages=user(TEXT), logprobs=True).http_response.json()
    assert set(raw["choices"][0]["logprobs"]) == {"content", "refusal"}
    assert all("id" not in item for item in raw["choices"][0]["logprobs"]["content"])


def test_no_logprobs_unless_asked(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(model="echo-1", messages=user(TEXT)).http_response.json()
    assert raw["choices"][0]["logprobs"] is None


def test_extensions_in_extra_body_are_accepted(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model="echo-1",
        messages=user(TEXT),
        extra_body={
            "top_k": 20,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "priority": 1,
            "min_tokens": 1,
            "ignore_eos": False,
            "skip_special_tokens": True,
            "include_stop_str_in_output": False,
            "stop_token_ids": [2],
            "chat_template_kwargs": {"enable_thinking": False},
            "add_generation_prompt": True,
        },
    )
    assert resp.choices[0].message.content == TEXT


def test_undeclared_extension_is_400_naming_it_and_the_backend(client: openai.OpenAI) -> None:
    # `plain-1` is served by a backend that declares no extension at all
    assert client.chat.completions.create(model="plain-1", messages=user(TEXT)).choices[0].message.content == TEXT
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="plain-1", messages=user(TEXT), extra_body={"top_k": 5})
    assert info.value.status_code == 400
    assert info.value.param == "top_k"
    assert "top_k" in info.value.message and "plain" in info.value.message


@pytest.mark.anyio
async def test_undeclared_extension_async(aclient: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await aclient.chat.completions.create(model="plain-1", messages=user(TEXT), extra_body={"min_p": 0.1})
    assert info.value.param == "min_p"


def test_model_name_is_echoed(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model="plain-1", messages=user(TEXT))
    assert resp.model == "plain-1"


# -- streaming -----------------------------------------------------------------------------------


def test_stream_sync(client: openai.OpenAI) -> None:
    with client.chat.completions.create(model="echo-1", messages=user(TEXT), stream=True) as stream:
        chunks = list(stream)
    check_stream(chunks)


@pytest.mark.anyio
async def test_stream_async(aclient: openai.AsyncOpenAI) -> None:
    stream = await aclient.chat.completions.create(model="echo-1", messages=user(TEXT), stream=True)
    chunks = [c async for c in stream]
    check_stream(chunks)


def test_stream_joins_to_non_stream_content(client: openai.OpenAI) -> None:
    text = "the quick brown fox, jumps; over the lazy dog! ünïcödé 🙂"
    full = client.chat.completions.create(model="echo-1", messages=user(text))
    with client.chat.completions.create(model="echo-1", messages=user(text), stream=True) as stream:
        chunks = list(stream)
    joined = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    assert joined == full.choices[0].message.content == " ".join(text.split())
    check_stream(chunks, text=full.choices[0].message.content)


def test_stream_n_two(client: openai.OpenAI) -> None:
    with client.chat.completions.create(model="echo-1", messages=user(TEXT), stream=True, n=2) as stream:
        chunks = list(stream)
    check_stream(chunks, n=2)


def test_stream_max_tokens_length(client: openai.OpenAI) -> None:
    with client.chat.completions.create(model="echo-1", messages=user(TEXT), stream=True, max_tokens=1) as stream:
        chunks = list(stream)
    check_stream(chunks, text="hello", finish="length")


def test_stream_logprobs(client: openai.OpenAI) -> None:
    with client.chat.completions.create(
        model="echo-1", messages=user(TEXT), stream=True, logprobs=True, top_logprobs=2
    ) as stream:
        chunks = list(stream)
    content = [ch for c in chunks for ch in c.choices if ch.delta.content]
    assert all(ch.logprobs is not None and len(ch.logprobs.content) == 1 for ch in content)
    assert [ch.logprobs.content[0].token for ch in content] == [ch.delta.content for ch in content]
    assert all(len(ch.logprobs.content[0].top_logprobs) == 2 for ch in content)


def _check_usage_stream(chunks: list[ChatCompletionChunk], n: int = 1) -> None:
    *body, last = chunks
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.prompt_tokens == PROMPT_TOKENS
    assert last.usage.completion_tokens == n * len(WORDS)
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert last.usage.prompt_tokens_details.cached_tokens == PROMPT_TOKENS // 2
    assert all(c.usage is None for c in body)
    assert all(c.choices for c in body), "only the usage chunk may have no choices"
    check_stream(body, n=n)


def test_stream_include_usage_sync(client: openai.OpenAI) -> None:
    with client.chat.completions.create(
        model="echo-1", messages=user(TEXT), stream=True, stream_options={"include_usage": True}
    ) as stream:
        chunks = list(stream)
    _check_usage_stream(chunks)


@pytest.mark.anyio
async def test_stream_include_usage_async(aclient: openai.AsyncOpenAI) -> None:
    stream = await aclient.chat.completions.create(
        model="echo-1", messages=user(TEXT), stream=True, n=2, stream_options={"include_usage": True}
    )
    _check_usage_stream([c async for c in stream], n=2)


def test_stream_include_usage_false_has_no_usage(client: openai.OpenAI) -> None:
    with client.chat.completions.create(
        model="echo-1", messages=user(TEXT), stream=True, stream_options={"include_usage": False}
    ) as stream:
        chunks = list(stream)
    check_stream(chunks)


def test_stream_error_before_first_token_raises_at_create(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="echo-1", messages=user("FAIL:invalid"), stream=True)


def test_stream_error_mid_stream_raises_after_the_tokens(client: openai.OpenAI) -> None:
    got: list[str] = []
    with pytest.raises(openai.APIError) as info:
        with client.chat.completions.create(model="echo-1", messages=user("a b c FAILMID:2 d"), stream=True) as stream:
            for chunk in stream:
                got += [ch.delta.content for ch in chunk.choices if ch.delta.content]
    assert got == ["a", " b"]
    assert "mid-stream" in info.value.message


@pytest.mark.anyio
async def test_concurrent_streams_do_not_mix(aclient: openai.AsyncOpenAI) -> None:
    async def one(i: int) -> tuple[str, set[str]]:
        text = " ".join(f"s{i}w{j}" for j in range(12))
        stream = await aclient.chat.completions.create(model="echo-1", messages=user(text), stream=True)
        chunks = [c async for c in stream]
        check_stream(chunks, text=text)
        return "".join(ch.delta.content or "" for c in chunks for ch in c.choices), {c.id for c in chunks}

    results = await asyncio.gather(*(one(i) for i in range(12)))
    assert [r[0] for r in results] == [" ".join(f"s{i}w{j}" for j in range(12)) for i in range(12)]
    ids = [next(iter(r[1])) for r in results]
    assert len(set(ids)) == len(ids)


# Words with the characters a hand-built JSON encoder gets wrong: quotes, backslashes, control
# characters, non-BMP code points. The echo backend splits on whitespace, so words hold none.
WORD = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=6).filter(lambda w: w.split() == [w])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(WORD, min_size=1, max_size=8))
def test_stream_equals_non_stream_property(client: openai.OpenAI, words: list[str]) -> None:
    text = " ".join(words)
    assert text.split() == words  # the strategy only makes whitespace-free words
    full = client.chat.completions.create(model="echo-1", messages=user(text))
    assert full.choices[0].message.content == text
    with client.chat.completions.create(model="echo-1", messages=user(text), stream=True) as stream:
        chunks = list(stream)
    check_stream(chunks, text=text)
