"""Load, CI-sized: 512 concurrent streaming clients on loopback against one gateway process
(the echo backend). Every stream must be complete, in order, and never mixed with another
request's chunks: each request's words are its own (`r<i>w<j>`), each response must carry
exactly its words in order under one chunk id that no other stream used, its own
`x-request-id`, one finish, its usage and `[DONE]`.

The figures (streams, errors, wall time, p50/p99 time to first byte and to the end) are
printed and written to `$SWITCHYARD_LOAD_REPORT` when set. `SWITCHYARD_LONG=1` runs 2,048
streams in four waves.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.server import echo_config, running_server
from tests.support.sse_client import Answer, post, sse_data

LONG = os.environ.get("SWITCHYARD_LONG") == "1"
CLIENTS = 512
WAVES = 4 if LONG else 1
WORDS = 12
DELAY = 0.01  # echo backend: seconds per token


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("load")
    text = "[server]\nhealth_interval_s = 0\nlog_level = \"warning\"\n\n" + echo_config(token_delay_s=DELAY, max_model_len=4096)
    with running_server(text, tmp) as base:
        yield base


def expected_words(i: int) -> list[str]:
    return [f"r{i}w{j}" for j in range(WORDS)]


async def one_stream(port: int, i: int, start_gate: asyncio.Event) -> Answer:
    body = {
        "model": "echo-1",
        "messages": [{"role": "user", "content": " ".join(expected_words(i))}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    await start_gate.wait()
    answer = await post("127.0.0.1", port, "/v1/chat/completions", body, {"x-request-id": f"load-{i}"})
    answer.extra["i"] = i
    return answer


def check_stream(answer: Answer) -> str:
    """The stream's chunk id; asserts it is complete, in order and only its own."""
    i = answer.extra["i"]
    assert answer.status == 200, answer.error or answer.body[:300]
    assert answer.headers["x-request-id"] == f"load-{i}"
    events = sse_data(answer.body)
    assert events[-1] == "[DONE]", events[-2:]
    chunks = events[:-1]
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1, f"stream {i} mixes chunk ids {ids}"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c for c in chunks[1:] if c["choices"]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in content)
    assert text == " ".join(expected_words(i)), f"stream {i} got {text!r}"
    assert [c["choices"][0]["finish_reason"] for c in content].count("stop") == 1
    assert content[-1]["choices"][0]["finish_reason"] == "stop"
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == WORDS
    return ids.pop()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def run_wave(port: int, wave: int) -> list[Answer]:
    gate = asyncio.Event()
    tasks = [asyncio.create_task(one_stream(port, wave * CLIENTS + i, gate)) for i in range(CLIENTS)]
    await asyncio.sleep(0.05)
    gate.set()  # all at once
    return await asyncio.gather(*tasks)


def test_512_concurrent_streams_complete_in_order_and_unmixed(gateway: str) -> None:
    port = int(gateway.rsplit(":", 1)[1])
    start = time.perf_counter()
    results: list[Answer] = []
    for wave in range(WAVES):
        results += asyncio.run(run_wave(port, wave))
    wall = time.perf_counter() - start
    errors = [r for r in results if r.status != 200]
    chunk_ids = [check_stream(r) for r in results]
    assert len(set(chunk_ids)) == len(results), "two streams shared a chunk id"
    totals = [r.total_s for r in results]
    ttfbs = [r.ttfb_s for r in results if r.status == 200]
    report = {
        "streams": len(results),
        "concurrent": CLIENTS,
        "errors": len(errors),
        "wall_s": round(wall, 2),
        "ttfb_p50_s": round(statistics.median(ttfbs), 3),
        "ttfb_p99_s": round(percentile(ttfbs, 0.99), 3),
        "total_p50_s": round(statistics.median(totals), 3),
        "total_p99_s": round(percentile(totals, 0.99), 3),
        "floor_s": WORDS * DELAY,
    }
    print("\nload:", json.dumps(report))
    if os.environ.get("SWITCHYARD_LOAD_REPORT"):
        Path(os.environ["SWITCHYARD_LOAD_REPORT"]).write_text(json.dumps(report, indent=2))
    assert not errors
