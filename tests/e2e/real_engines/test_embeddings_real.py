"""`/v1/embeddings` with the official `openai` client on every backend: the built-in engine, and
real llama.cpp (`llama-server --embeddings`) and vLLM (`--runner pooling --convert embed`)
embedding servers through the proxies — all the default model, last-token pooling, normalized.

The embedding servers are this module's own (a vLLM instance runs one runner, so the
generation server of the other proxy tests cannot serve embeddings); they start together with
the gateway and stop at the module's end.
"""

from __future__ import annotations

import base64
import math
import os
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from engines import install
from engines.launch import start_llamacpp, start_vllm
from tests.e2e.real_engines.conftest import CONTEXT, EXTERNAL_ENV, MODEL
from tests.support.server import running_server

HIDDEN_SIZE = 576  # the default model's
TEXTS = ["The cat sat on the mat.", "Paris is the capital of France.", "def add(a, b): return a + b"]


def _start(engine: str, log_dir):  # noqa: ANN001, ANN202
    if engine == "llamacpp":
        return start_llamacpp(alias=MODEL, ctx_size=CONTEXT, parallel=1, threads=1, log_dir=log_dir, embeddings=True)
    return start_vllm(served_model_names=[MODEL], max_model_len=CONTEXT, enforce_eager=True, kv_cache_space_gib=1,
                      log_dir=log_dir, embeddings=True,
                      timeout=float(os.environ.get("SWITCHYARD_VLLM_START_TIMEOUT", "420")))


def _config(servers: dict) -> str:
    lines = ['[plugins]', 'modules = ["plugins.proxy.vllm", "plugins.proxy.llamacpp"]', "",
             "[[backends]]", 'name = "builtin"', 'type = "builtin"', "[backends.options]", f'model = "{MODEL}"',
             'served_model_name = "emb-builtin"', f"max_model_len = {CONTEXT}", "num_threads = 1", ""]
    for engine, server in servers.items():
        lines += ["[[backends]]", f'name = "{engine}"', f'type = "{engine}"', "[backends.options]",
                  f'base_url = "{server.base_url}"', f'models = {{ "emb-{engine}" = "{MODEL}" }}', "embeddings = true", ""]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    wanted = [e for e in ("llamacpp", "vllm")
              if not os.environ.get(EXTERNAL_ENV[e]) and (install.llamacpp_installed() if e == "llamacpp" else install.vllm_installed())]
    log_dir = tmp_path_factory.mktemp("embedding-engines")
    servers: dict = {}
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {e: pool.submit(_start, e, log_dir) for e in wanted}
            for engine, future in futures.items():
                servers[engine] = future.result()
        with running_server(_config(servers), tmp_path_factory.mktemp("embeddings-gateway"), ready_timeout=300) as base:
            with openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=120) as c:
                c.served = ["builtin", *servers]  # type: ignore[attr-defined]
                yield c
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture(params=["builtin", "llamacpp", "vllm"])
def model(request: pytest.FixtureRequest, client: openai.OpenAI) -> str:
    if request.param not in client.served:  # type: ignore[attr-defined]
        pytest.skip(f"{request.param} is not installed; run `python -m engines.install {request.param}`")
    return f"emb-{request.param}"


def vectors(client: openai.OpenAI, model: str, inputs, **kwargs) -> list[list[float]]:  # noqa: ANN001
    return [d.embedding for d in client.embeddings.create(model=model, input=inputs, **kwargs).data]


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_shape_norm_and_usage(client: openai.OpenAI, model: str) -> None:
    result = client.embeddings.create(model=model, input=TEXTS, encoding_format="float")
    assert [d.index for d in result.data] == [0, 1, 2]
    for d in result.data:
        assert len(d.embedding) == HIDDEN_SIZE
        assert math.isclose(math.sqrt(sum(v * v for v in d.embedding)), 1.0, rel_tol=1e-3)
    assert result.usage.prompt_tokens == result.usage.total_tokens > len(TEXTS)
    assert result.model == model


def test_float_and_base64_decode_equal(client: openai.OpenAI, model: str) -> None:
    floats = vectors(client, model, TEXTS[0], encoding_format="float")[0]
    raw = client.embeddings.with_raw_response.create(model=model, input=TEXTS[0], encoding_format="base64")
    packed = base64.b64decode(raw.http_response.json()["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(packed) // 4}f", packed)) == pytest.approx(floats, rel=1e-6, abs=1e-7)


def test_batch_equals_one_by_one(client: openai.OpenAI, model: str) -> None:
    batch = vectors(client, model, TEXTS, encoding_format="float")
    for text, vector in zip(TEXTS, batch):
        single = vectors(client, model, text, encoding_format="float")[0]
        assert single == pytest.approx(vector, abs=2e-3)  # engines may batch in bfloat16
        assert cosine(single, vector) > 0.9999


def test_identical_input_identical_vectors(client: openai.OpenAI, model: str) -> None:
    first = vectors(client, model, TEXTS[1], encoding_format="float")[0]
    second = vectors(client, model, TEXTS[1], encoding_format="float")[0]
    assert second == pytest.approx(first, abs=1e-5)


def test_token_ids_equal_their_text(client: openai.OpenAI, model: str) -> None:
    """The same prompt as token ids (as /tokenize of the built-in engine gives them) embeds the same."""
    import httpx

    base = str(client.base_url).removesuffix("/v1/")
    ids = httpx.post(base + "/tokenize", json={"model": "emb-builtin", "prompt": TEXTS[2]}).json()["tokens"]
    by_text = vectors(client, model, TEXTS[2], encoding_format="float")[0]
    by_ids = vectors(client, model, [ids], encoding_format="float")[0]
    assert cosine(by_ids, by_text) > 0.9999


def test_dimensions_refused_where_the_model_cannot(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=model, input="x", dimensions=64)


def test_engines_agree(client: openai.OpenAI) -> None:
    """Same model, same pooling: the vectors of each engine point the same way (vLLM and
    llama.cpp run it in bfloat16 / a GGUF, so not bit for bit)."""
    served = client.served  # type: ignore[attr-defined]
    if len(served) < 2:
        pytest.skip("no real engine installed")
    by_engine = {e: vectors(client, f"emb-{e}", TEXTS, encoding_format="float") for e in served}
    for engine in served[1:]:
        for reference, vector in zip(by_engine["builtin"], by_engine[engine]):
            assert cosine(reference, vector) > 0.98, engine
