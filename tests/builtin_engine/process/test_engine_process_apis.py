"""/v1/embeddings and the Messages API's `stop_sequence` with the engine in a process of its own
(`engine_process = true`), through a real server and the official clients: the pooled vectors
cross the process boundary as the engine in process computes them, and so does the stop string
that ended a choice."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import anthropic
import openai

from plugins.builtin.backend import BuiltinBackend
from plugins.contract.protocol import EmbedRequest
from tests.builtin_engine.process.test_engine_process import options
from tests.support.process_tree import serving

GREEDY = {"temperature": 0}
TEXTS = ["The quick brown fox", "jumps over the lazy dog", "a third, longer input to pool over several tokens"]


def _config(model_dir: Path) -> str:
    return f"""[[backends]]
name = "builtin"
type = "builtin"
[backends.options]
model = "{model_dir}"
served_model_name = "tiny"
num_threads = 1
kv_cache_tokens = 4096
engine_process = true
[backends.options.embeddings]
pooling = "mean"
"""


def _in_process_vectors(model_dir: Path) -> list[list[float]]:
    async def main() -> list[list[float]]:
        backend = BuiltinBackend("local", options(model_dir, embeddings={"pooling": "mean"}))
        await backend.start()
        try:
            result = await backend.embed(EmbedRequest(request_id="r", upstream_model="tiny", inputs=TEXTS))
        finally:
            await backend.close()
        return result.embeddings

    return asyncio.run(main())


def test_embeddings_and_stop_sequence_cross_the_engine_process(tmp_path: Path, tiny_model_dir: Path) -> None:
    expected = _in_process_vectors(tiny_model_dir)
    with serving(_config(tiny_model_dir), tmp_path) as server:
        assert len(server.children("builtin_engine.process.server")) == 1
        with openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
            answer = client.embeddings.create(model="tiny", input=TEXTS)
        vectors = [item.embedding for item in answer.data]
        assert [item.index for item in answer.data] == [0, 1, 2]
        assert all(math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-4) for v in vectors)
        for got, want in zip(vectors, expected, strict=True):
            assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-5

        ask = [{"role": "user", "content": "What is the capital of France?"}]
        with anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0, timeout=60) as claude:
            full = claude.messages.create(model="tiny", max_tokens=30, messages=ask, extra_body=GREEDY).content[0].text
            assert len(full) >= 12, full
            stop = full[6:10]
            message = claude.messages.create(model="tiny", max_tokens=30, messages=ask, extra_body=GREEDY,
                                             stop_sequences=[stop, "zzzz-never"])
            with claude.messages.stream(model="tiny", max_tokens=30, messages=ask, extra_body=GREEDY,
                                        stop_sequences=[stop]) as stream:
                streamed = stream.get_final_message()
        for got in (message, streamed):
            assert (got.stop_reason, got.stop_sequence) == ("stop_sequence", stop), (got, full)
            assert got.content[0].text == full[: full.index(stop)]


def test_an_embedding_request_cancelled_midway_is_freed_in_the_engine_process(tiny_model_dir: Path) -> None:
    """The client left: the `Embed` stream is closed, and the engine process aborts its prompts."""

    async def main() -> None:
        backend = BuiltinBackend("local", options(tiny_model_dir, engine_process=True, max_num_batched_tokens=8,
                                                  embeddings={"pooling": "mean"}))
        await backend.start()
        engine = backend.engine
        assert engine is not None
        try:
            inputs = [[5 + (i * 7 + j) % 200 for j in range(400)] for i in range(8)]  # 400 steps of 8 tokens
            task = asyncio.create_task(backend.embed(EmbedRequest(request_id="e", upstream_model="tiny", inputs=inputs)))
            while (await engine.stats()).num_unfinished_requests == 0:
                await asyncio.sleep(0.01)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert task.cancelled()
            for _ in range(1000):
                stats = await engine.stats()
                if stats.num_unfinished_requests == 0 and stats.num_free_blocks == stats.num_blocks:
                    break
                await asyncio.sleep(0.01)
            assert (stats.num_unfinished_requests, stats.num_free_blocks) == (0, stats.num_blocks), stats
            assert len(stats.abort_latencies) == 8, stats  # aborted, not run to the end
        finally:
            await backend.close()

    asyncio.run(main())
