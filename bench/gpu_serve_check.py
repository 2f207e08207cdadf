"""The gateway serving the built-in engine (on a GPU), driven by the official openai client:

    python -m gateway.cli serve --config plugins.toml &     # a `builtin` backend, device = "auto"
    python bench/gpu_serve_check.py http://127.0.0.1:PORT [STREAMS ...]

JSON and streamed chat completions (usage), completions with logprobs, an over-long request's
400, how soon the engine frees a stream the client closes (its `switchyard_replica_engine_requests`
gauge), then output tokens/s and TTFT p50 at 1/16/64 streams of 128 tokens (16 tokens each when
STREAMS are given). Needs only the gateway's packages and `openai`.
"""

import asyncio
import re
import sys
import time
import urllib.request

import openai


def check_api(client: openai.OpenAI, model: str) -> None:
    messages = [{"role": "user", "content": "Write a haiku about GPUs."}]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=16)
    print("json:", r.choices[0].finish_reason, r.usage.prompt_tokens, r.usage.completion_tokens,
          repr(r.choices[0].message.content[:40]))
    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=16, stream=True,
                                                 stream_options={"include_usage": True}))
    print("stream:", len(chunks), "chunks; usage", chunks[-1].usage.completion_tokens)
    c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, logprobs=2)
    print("completions:", c.choices[0].finish_reason, len(c.choices[0].logprobs.tokens))
    try:
        client.chat.completions.create(model=model, messages=messages, max_tokens=10**9)
    except openai.BadRequestError as exc:
        print("bad request ->", exc.status_code, str(exc.message)[:80])


def engine_requests(base: str) -> float | None:
    text = urllib.request.urlopen(base + "/metrics").read().decode()
    pattern = r'^switchyard_replica_engine_requests{[^}]*backend="builtin"[^}]*} ([0-9.e+-]+)$'
    values = [float(m.group(1)) for m in re.finditer(pattern, text, re.M)]
    return sum(values) if values else None


def abort_latency(client: openai.OpenAI, model: str, base: str) -> None:
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count."}],
                                            max_tokens=1000, stream=True, extra_body={"ignore_eos": True})
    for _, _ in zip(range(3), stream, strict=False):
        pass
    print("engine requests before close:", engine_requests(base))
    closed = time.perf_counter()
    stream.close()
    while (engine_requests(base) or 0) > 0 and time.perf_counter() - closed < 5:
        time.sleep(0.01)
    print(f"abort: engine requests {engine_requests(base)} after {1000 * (time.perf_counter() - closed):.0f} ms")


async def load(base: str, model: str, streams: int, tokens: int) -> None:
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
    ttfts: list[float] = []

    async def one(i: int) -> int:
        started, first, count = time.perf_counter(), None, 0
        stream = await client.completions.create(
            model=model, prompt=f"Story {i}: " + "once upon a time " * 30, max_tokens=tokens, stream=True,
            extra_body={"ignore_eos": True}, stream_options={"include_usage": True})
        async for chunk in stream:
            if chunk.usage is not None:
                count = chunk.usage.completion_tokens
            elif first is None:
                first = time.perf_counter() - started
        ttfts.append(first if first is not None else float("nan"))
        return count

    started = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(streams)))
    took = time.perf_counter() - started
    ttfts.sort()
    print(f"gateway, {streams} streams x {tokens} tokens: {sum(counts) / took:.0f} output tok/s, "
          f"TTFT p50 {1000 * ttfts[len(ttfts) // 2]:.0f} ms")
    await client.close()


def main() -> None:
    base, streams = sys.argv[1], [int(a) for a in sys.argv[2:]]
    client = openai.OpenAI(base_url=base + "/v1", api_key="none")
    model = client.models.list().data[0].id
    check_api(client, model)
    abort_latency(client, model, base)
    asyncio.run(load(base, model, 4, 16))  # the first requests of the run
    for count in streams or (1, 16, 64):
        asyncio.run(load(base, model, count, 16 if streams else 128))


if __name__ == "__main__":
    main()
