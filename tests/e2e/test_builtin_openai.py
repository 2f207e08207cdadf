"""End to end: a real Switchyard server (subprocess) serving the real default model through the
built-in engine, driven by the official `openai` client.

One server for the module, with `max_num_seqs = 1` so that requests queue behind each other:
that is what makes priority ordering and the effect of a client's disconnect observable from
outside (a follow-up request is served at once only if the abandoned one left the batch).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.probes import metric, wait_until
from tests.support.server import running_server

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
MAX_MODEL_LEN = 1024
FRANCE = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
CONFIG = f"""
[server]
log_level = "warning"
health_interval_s = 0

[[backends]]
name = "builtin"
type = "builtin"
[backends.options]
model = "{MODEL}"
num_threads = 1
max_num_seqs = 1
max_model_len = {MAX_MODEL_LEN}
kv_cache_tokens = 4096
max_num_batched_tokens = 128
"""


@pytest.fixture(scope="module")
def base_url(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # `default_model_dir` fetches and converts the model first, so the server only loads it
    with running_server(CONFIG, tmp_path_factory.mktemp("e2e-builtin")) as base:
        yield base


@pytest.fixture(scope="module")
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def _new_client(base_url: str) -> openai.OpenAI:
    """A client of its own (its own connection), for requests made from other threads."""
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _tokenize(base_url: str, messages: list[dict[str, str]]) -> list[int]:
    response = httpx.post(base_url + "/tokenize", json={"model": MODEL, "messages": messages}, timeout=30)
    response.raise_for_status()
    body = response.json()
    assert body["count"] == len(body["tokens"])
    return body["tokens"]


def _in_flight(base_url: str) -> float:
    """Requests the gateway is serving now, from its /metrics."""
    return metric(httpx.get(base_url + "/metrics", timeout=10).text, "switchyard_requests_in_flight")


def test_streamed_answer_from_the_default_model(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=20,
                                            stream=True)
    text, finish = "", None
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert text == "The capital of France is Paris."
    assert finish == "stop"


def test_include_usage_counts_the_templated_prompt(client: openai.OpenAI, base_url: str) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=3,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    assert usage.prompt_tokens == len(_tokenize(base_url, FRANCE)) == 27
    assert usage.completion_tokens == 3
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_second_identical_request_is_served_from_the_prefix_cache(client: openai.OpenAI) -> None:
    # a fresh prompt of several 16-token blocks, so that nothing earlier cached any of it
    messages = [
        {"role": "system", "content": f"Session {uuid.uuid4().hex}. You are a concise assistant who answers "
                                      "questions about European geography in one short sentence."},
        {"role": "user", "content": "Which river flows through Paris, and into which sea does it flow?"},
    ]
    first = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=2)
    second = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=2)
    assert first.usage is not None and second.usage is not None
    assert first.usage.prompt_tokens == second.usage.prompt_tokens > 32
    assert first.usage.prompt_tokens_details is not None and second.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached > 0 and cached % 16 == 0
    assert cached >= second.usage.prompt_tokens - 16  # every full block of the prompt
    assert first.choices[0].message.content == second.choices[0].message.content


def test_lower_priority_value_is_served_first_under_load(client: openai.OpenAI, base_url: str) -> None:
    """One batch slot, held by a long request; three more arrive with priorities 5, 0 and 2 (in
    that order) and must finish in priority order, not arrival order."""
    already = _in_flight(base_url)
    blocker = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count from one to one hundred."}], temperature=0,
        max_tokens=60, stream=True, extra_body={"ignore_eos": True},
    )
    next(iter(blocker))  # it runs: the slot is taken
    finished: list[int] = []
    lock = threading.Lock()

    def queued(priority: int) -> None:
        with _new_client(base_url) as own:
            own.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"Say the number {priority}."}],
                temperature=0, max_tokens=2, extra_body={"priority": priority},
            )
        with lock:
            finished.append(priority)

    threads = []
    for priority in (5, 0, 2):  # arrival order 5, 0, 2: each waits until the one before is in
        threads.append(threading.Thread(target=queued, args=(priority,)))
        threads[-1].start()
        assert wait_until(lambda: _in_flight(base_url) == already + 1 + len(threads), timeout=30), _in_flight(base_url)
    assert not finished, "the blocker ended before every request was queued; give it more tokens"
    for chunk in blocker:
        pass
    for thread in threads:
        thread.join(60)
    assert finished == [0, 2, 5]


def test_over_long_prompt_is_a_400_before_anything_runs(client: openai.OpenAI) -> None:
    words = " ".join(["word"] * (MAX_MODEL_LEN + 50))
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": words}], max_tokens=5)
    assert info.value.code == "context_length_exceeded"
    assert info.value.status_code == 400


def test_render_gives_the_tokens_of_tokenize(base_url: str) -> None:
    response = httpx.post(base_url + "/switchyard/render", json={"model": MODEL, "messages": FRANCE}, timeout=30)
    response.raise_for_status()
    (render,) = response.json()["renders"]
    assert render["backend"] == "builtin"
    assert render["tokens"] == _tokenize(base_url, FRANCE)
    assert render["text"].startswith("<|im_start|>system\nYou are a concise assistant.<|im_end|>")


def test_disconnect_mid_stream_frees_the_engine_at_once(client: openai.OpenAI, base_url: str) -> None:
    """A client that goes away mid-stream: its sequence leaves the engine (the one batch slot is
    free again), so a follow-up request is served at once instead of after ~500 more tokens."""
    long_request = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a very long story about a lighthouse."}],
        temperature=0, max_tokens=500, stream=True, extra_body={"ignore_eos": True},
    )
    received = 0
    for chunk in long_request:
        received += sum(1 for c in chunk.choices if c.delta.content)
        if received >= 3:
            break
    long_request.close()  # drops the connection
    closed_at = time.monotonic()
    with _new_client(base_url) as own:
        stream = own.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=3, stream=True)
        first_token_after = None
        for chunk in stream:
            if first_token_after is None and any(c.delta.content for c in chunk.choices):
                first_token_after = time.monotonic() - closed_at
    assert first_token_after is not None
    # 500 tokens at ~15-70 tokens/s would hold the slot for 7-30 s; a freed slot serves at once
    assert first_token_after < 5.0, f"follow-up's first token {first_token_after:.2f} s after the disconnect"
