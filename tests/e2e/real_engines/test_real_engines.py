"""Real llama.cpp and real vLLM serving the default model, through the gateway, with the
official `openai` client: the wire a client sees must not tell the engines apart (except the
`x-switchyard-backend` header)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import httpx
import openai
import pytest

from engines.launch import ServerProcess
from tests.e2e.real_engines.conftest import CONTEXT, MODEL, public_name

FRANCE = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
LONG_SYSTEM = "You are a meticulous assistant for a railway switchyard. " + " ".join(
    f"Rule {i}: trains on track {i} must wait for signal {i} before moving to the hump." for i in range(1, 25)
)


@pytest.fixture(scope="session")
def client(gateway_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def sse_chunks(gateway_url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The raw chunks of a streamed response (to see keys the SDK would hide)."""
    chunks = []
    with httpx.stream("POST", gateway_url + "/v1/chat/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def test_models_carry_max_model_len(gateway_url: str, engine: str) -> None:
    cards = httpx.get(gateway_url + "/v1/models").json()["data"]
    card = next(c for c in cards if c["id"] == public_name(engine))
    assert card["max_model_len"] == CONTEXT
    assert httpx.get(gateway_url + "/ready").status_code == 200


def test_non_streaming(client: openai.OpenAI, engine: str) -> None:
    raw = client.chat.completions.with_raw_response.create(model=public_name(engine), messages=FRANCE,
                                                           temperature=0, max_tokens=32)
    assert raw.headers["x-switchyard-backend"] == engine
    resp = raw.parse()
    assert resp.model == public_name(engine)  # the name the client asked for, not the upstream's
    assert resp.id.startswith("chatcmpl-") and abs(resp.created - time.time()) < 120
    assert resp.choices[0].finish_reason == "stop"
    assert "Paris" in resp.choices[0].message.content
    assert resp.usage.prompt_tokens == 27
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert resp.usage.prompt_tokens_details is not None and resp.usage.prompt_tokens_details.cached_tokens is not None


def test_streaming(gateway_url: str, engine: str) -> None:
    chunks = sse_chunks(gateway_url, {"model": public_name(engine), "messages": FRANCE, "temperature": 0,
                                      "max_tokens": 32, "stream": True})
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    body = chunks[1:]
    assert all(c["choices"] for c in chunks)  # no usage chunk: not asked for
    for c in body[:-1]:
        assert c["choices"][0]["delta"].get("content"), c  # no empty deltas
        assert c["choices"][0]["finish_reason"] is None
    assert body[-1]["choices"][0]["finish_reason"] == "stop"
    assert "Paris" in "".join(c["choices"][0]["delta"].get("content") or "" for c in body)
    for c in chunks:
        assert c["model"] == public_name(engine) and c["id"] == chunks[0]["id"]
        assert not {"stop_reason", "timings", "token_ids", "prompt_token_ids"} & (set(c) | set(c["choices"][0]))


def test_streaming_with_usage(client: openai.OpenAI, engine: str) -> None:
    stream = client.chat.completions.create(model=public_name(engine), messages=FRANCE, temperature=0, max_tokens=32,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    u = usage_chunk.usage
    assert u.prompt_tokens == 27 and u.completion_tokens > 0
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert isinstance(u.prompt_tokens_details.cached_tokens, int)


def test_max_tokens_stops_with_length(client: openai.OpenAI, engine: str) -> None:
    resp = client.chat.completions.create(model=public_name(engine), messages=FRANCE, temperature=0, max_tokens=3)
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 3


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_too_long_is_400_context_length_exceeded(client: openai.OpenAI, engine: str, stream: bool) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=public_name(engine), messages=[{"role": "user", "content": "switch " * 3000}],
                                       max_tokens=4, stream=stream)
    assert info.value.status_code == 400
    assert info.value.code == "context_length_exceeded"
    assert info.value.body["type"] == "invalid_request_error"


def test_extension_samplers_accepted(client: openai.OpenAI, engine: str) -> None:
    resp = client.chat.completions.create(model=public_name(engine), messages=FRANCE, max_tokens=8, temperature=0.7,
                                          seed=1, extra_body={"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2})
    assert resp.choices[0].message.content
    assert resp.usage.completion_tokens > 0


def test_priority(client: openai.OpenAI, engine: str) -> None:
    def ask() -> Any:
        return client.chat.completions.create(model=public_name(engine), messages=FRANCE, max_tokens=2,
                                              extra_body={"priority": 1})

    if engine == "llamacpp":
        with pytest.raises(openai.BadRequestError) as info:
            ask()
        assert info.value.status_code == 400
        assert info.value.body["param"] == "priority"
        assert "priority" in info.value.message and "llamacpp" in info.value.message
    else:
        assert ask().choices[0].finish_reason in ("stop", "length")


def test_repeated_prompt_reports_cached_tokens(client: openai.OpenAI, engine: str) -> None:
    messages = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "Which track waits for signal 7?"}]
    usages = [client.chat.completions.create(model=public_name(engine), messages=messages, temperature=0,
                                             max_tokens=4).usage for _ in range(2)]
    assert usages[0].prompt_tokens >= 128  # vLLM's CPU prefix cache counts whole 128-token blocks
    assert usages[1].prompt_tokens_details.cached_tokens > 0
    stream = client.chat.completions.create(model=public_name(engine), messages=messages, temperature=0, max_tokens=4,
                                            stream=True, stream_options={"include_usage": True})
    assert list(stream)[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_completions_endpoint(client: openai.OpenAI, engine: str) -> None:
    resp = client.completions.create(model=public_name(engine), prompt="The capital of France is", max_tokens=5,
                                     temperature=0)
    assert resp.model == public_name(engine)
    assert resp.choices[0].text and resp.choices[0].finish_reason in ("stop", "length")
    assert resp.usage.prompt_tokens > 0


def test_tokenize_and_detokenize(gateway_url: str, engine: str) -> None:
    got = httpx.post(gateway_url + "/tokenize", json={"model": public_name(engine), "messages": FRANCE}).json()
    assert got["count"] == 27 == len(got["tokens"])
    assert got["max_model_len"] == CONTEXT
    text = httpx.post(gateway_url + "/detokenize", json={"model": public_name(engine), "tokens": got["tokens"]}).json()
    assert "What is the capital of France?" in text["prompt"]


def test_both_engines_build_the_same_prompt(gateway_url: str, engine_servers: dict[str, ServerProcess]) -> None:
    """The template inspector's core: the token ids each server really builds for a conversation."""
    if len(engine_servers) < 2:
        pytest.skip("needs both engines")
    from plugins.proxy.llamacpp import LlamaCppBackend, LlamaCppOptions
    from plugins.proxy.vllm import VLLMBackend, VLLMOptions

    async def render_both() -> dict[str, Any]:
        backends = {"llamacpp": LlamaCppBackend("l", LlamaCppOptions(base_url=engine_servers["llamacpp"].base_url)),
                    "vllm": VLLMBackend("v", VLLMOptions(base_url=engine_servers["vllm"].base_url))}
        try:
            return {k: await b.render(MODEL, FRANCE) for k, b in backends.items()}
        finally:
            for b in backends.values():
                await b.close()

    rendered = asyncio.run(render_both())
    assert rendered["llamacpp"].tokens == rendered["vllm"].tokens
    assert rendered["llamacpp"].text.startswith("<|im_start|>system\nYou are a concise assistant.<|im_end|>")
    assert rendered["vllm"].text == rendered["llamacpp"].text


def _shape(chunks: list[Any]) -> list[str]:
    """The stream's chunk kinds in order, runs of text collapsed. The finish reason rides on the
    last text chunk when the engine produced both at once (vLLM coalesces its last tokens when
    the client reads slower than it decodes) and comes alone otherwise; the contract allows
    both, so that one pair is listed as two kinds."""
    shape: list[str] = []
    for c in chunks:
        if not c.choices:
            kind = "usage:" + ",".join(sorted(c.usage.model_dump(exclude_none=True)))
        else:
            ch = c.choices[0]
            kind = ("role" if ch.delta.role else "") + ("text" if ch.delta.content else "") + (
                f"finish:{ch.finish_reason}" if ch.finish_reason else "")
            assert kind, f"empty chunk: {c}"
        for part in (["text", kind[len("text"):]] if kind.startswith("textfinish:") else [kind]):
            if not shape or shape[-1] != part or part != "text":
                shape.append(part)
    return shape


def test_same_chunk_shape_and_usage_fields_across_engines(client: openai.OpenAI, engine_servers: dict[str, ServerProcess],
                                                          request: pytest.FixtureRequest) -> None:
    names = [public_name(e) for e in engine_servers]
    if len(names) < 2:
        pytest.skip("needs both engines")
    shapes = {}
    for name in names:
        stream = client.chat.completions.create(model=name, messages=FRANCE, temperature=0, max_tokens=32, stream=True,
                                                stream_options={"include_usage": True})
        shapes[name] = _shape(list(stream))
    first = shapes[names[0]]
    assert first[0] == "role" and first[-1].startswith("usage:") and "prompt_tokens_details" in first[-1]
    for name in names[1:]:
        assert shapes[name] == first, shapes


def test_same_shape_with_the_builtin_engine(engine_servers: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> None:
    """The three engines through one gateway: the built-in engine streams the same chunk shape
    and usage fields as the proxied ones."""
    from tests.e2e.real_engines.conftest import gateway_config
    from tests.support.server import running_server

    if not engine_servers:
        pytest.skip("no proxied engine installed")
    config = gateway_config(engine_servers, builtin=True)
    with running_server(config, tmp_path_factory.mktemp("gateway-builtin"), ready_timeout=300) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
        shapes = {}
        for name in [public_name("builtin")] + [public_name(e) for e in engine_servers]:
            stream = client.chat.completions.create(model=name, messages=FRANCE, temperature=0, max_tokens=32,
                                                    stream=True, stream_options={"include_usage": True})
            shapes[name] = _shape(list(stream))
    reference = shapes[public_name("builtin")]
    for name, shape in shapes.items():
        assert shape == reference, shapes


def test_cancellation_reaches_upstream(gateway_url: str, engine: str, engine_servers: dict[str, ServerProcess]) -> None:
    upstream = engine_servers[engine].base_url

    def running() -> int:
        text = httpx.get(upstream + "/metrics").text
        metric = "llamacpp:requests_processing" if engine == "llamacpp" else "vllm:num_requests_running"
        values = [float(m) for m in re.findall(rf"^{re.escape(metric)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)]
        assert values, f"{metric} not in {upstream}/metrics"
        return int(sum(values))

    body = {"model": public_name(engine), "messages": FRANCE, "max_tokens": CONTEXT - 64, "ignore_eos": True,
            "temperature": 0, "stream": True}
    with httpx.stream("POST", gateway_url + "/v1/chat/completions", json=body, timeout=60) as resp:
        lines = resp.iter_lines()
        got = [next(lines) for _ in range(8)]
        assert any('"content"' in line for line in got)
        assert running() == 1
    closed = time.monotonic()  # the client hung up mid-generation
    while running() and time.monotonic() - closed < 10:
        time.sleep(0.1)
    assert running() == 0, "the upstream still generates for a client that has gone"
    assert time.monotonic() - closed < 10


def test_plugin_launches_and_stops_llama_server(engine_servers: dict[str, ServerProcess]) -> None:
    if "llamacpp" not in engine_servers:
        pytest.skip("llama.cpp is not installed")
    from plugins.proxy.llamacpp import LlamaCppBackend, LlamaCppLaunch, LlamaCppOptions

    async def main() -> None:
        backend = LlamaCppBackend("own", LlamaCppOptions(launch=LlamaCppLaunch(ctx_size=1024, parallel=1, threads=1)))
        await backend.start()
        pid = backend.launched.pid
        try:
            assert await backend.health()
            infos = await backend.models()
            assert [(i.id, i.max_model_len) for i in infos] == [(MODEL, 1024)]
        finally:
            server = backend.launched
            await backend.close()
        assert server.proc.poll() is not None, f"llama-server {pid} still running"

    asyncio.run(main())
