"""Record what real vLLM and llama.cpp servers send, for the proxy's fast unit tests.

    python scripts/record_upstreams.py                     # start both servers, record, stop them
    python scripts/record_upstreams.py --engine llamacpp   # one engine
    python scripts/record_upstreams.py --vllm-url http://127.0.0.1:8001 --llamacpp-url http://127.0.0.1:8002

The servers serve the default model (llama.cpp: its GGUF; vLLM: the converted HF directory),
started by `engines.launch` exactly as the proxy tests start them. Each case is written to
`tests/recordings/<engine>/<case>.json`:

    {"engine", "engine_version", "case", "method", "path", "request": <the JSON body sent>,
     "built_by_plugin": true when the body is exactly what the plugin builds for `spec`,
     "spec": <the RequestSpec fields used>, "status", "content_type",
     "body": <the response body as text>, "chunk_sizes": [<bytes per network read, in order>]}

`chunk_sizes` keeps the boundaries the bytes really arrived in, so the SSE parser is tested on
real splits. Nothing in these files is written by hand; rerun this script to refresh them after
an engine upgrade.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from scripts.engine_servers import add_engine_args, chosen_engines, engine_server  # noqa: E402
from plugins.proxy.llamacpp import LlamaCppBackend, LlamaCppOptions  # noqa: E402
from plugins.contract.protocol import RequestSpec, Sampling  # noqa: E402
from plugins.proxy.backend import ProxyBackend  # noqa: E402
from plugins.proxy.vllm import VLLMBackend, VLLMOptions  # noqa: E402

MODEL = "smollm2-135m-instruct"
OUT = ROOT / "tests" / "recordings"
FRANCE = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
# > 128 tokens (vLLM's CPU prefix cache counts in 128-token blocks)
LONG_SYSTEM = "You are a meticulous assistant for a railway switchyard. " + " ".join(
    f"Rule {i}: trains on track {i} must wait for signal {i} before moving to the hump." for i in range(1, 25)
)
CACHED = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "Which track waits for signal 7?"}]
OVERFLOW = [{"role": "user", "content": "switch " * 3000}]  # > 2048 tokens
VLLM_MAX_MODEL_LEN = 2048
LLAMACPP_CTX, LLAMACPP_SLOTS = 4096, 2  # 2048 tokens per request, as vLLM


def spec(case: str, *, kind: str = "chat", messages: list | None = None, prompt: Any = None, stream: bool = True,
         extensions: frozenset[str] = frozenset(), priority: int = 0, structured_outputs: dict | None = None,
         **sampling: Any) -> RequestSpec:
    return RequestSpec(
        request_id=f"rec-{case}", kind=kind, model=MODEL, upstream_model=MODEL,  # type: ignore[arg-type]
        sampling=Sampling(**sampling), messages=messages if kind == "chat" else None,
        prompt=prompt if kind == "completion" else None, stream=stream, include_usage=True,
        extensions=extensions, priority=priority, structured_outputs=structured_outputs,
    )


def common_cases() -> list[tuple[str, RequestSpec]]:
    return [
        ("chat_stream", spec("chat_stream", messages=FRANCE, temperature=0.0, max_tokens=32)),
        ("chat_stream_length", spec("chat_stream_length", messages=FRANCE, temperature=0.0, max_tokens=3)),
        ("chat_stream_stop", spec("chat_stream_stop", messages=FRANCE, temperature=0.0, max_tokens=32, stop=("Paris",))),
        ("chat_stream_samplers", spec("chat_stream_samplers", messages=FRANCE, temperature=0.7, top_k=5, min_p=0.1,
                                      repetition_penalty=1.2, seed=1, max_tokens=8,
                                      extensions=frozenset({"top_k", "min_p", "repetition_penalty"}))),
        ("chat_stream_logprobs", spec("chat_stream_logprobs", messages=FRANCE, temperature=0.0, max_tokens=4,
                                      logprobs=True, top_logprobs=2)),
        ("chat_stream_choice", spec("chat_stream_choice", messages=FRANCE, temperature=0.0, max_tokens=8,
                                    structured_outputs={"choice": ["Paris", "Lyon"]},
                                    extensions=frozenset({"structured_outputs"}))),
        ("chat_cached_first", spec("chat_cached_first", messages=CACHED, temperature=0.0, max_tokens=4)),
        ("chat_cached_second", spec("chat_cached_second", messages=CACHED, temperature=0.0, max_tokens=4)),
        ("chat_prompt_too_long", spec("chat_prompt_too_long", messages=OVERFLOW, temperature=0.0, max_tokens=4)),
        ("completion_stream", spec("completion_stream", kind="completion", prompt="The capital of France is",
                                   temperature=0.0, max_tokens=8)),
    ]


def vllm_cases() -> list[tuple[str, RequestSpec]]:
    return [
        ("chat_stream_n2", spec("chat_stream_n2", messages=FRANCE, temperature=1.0, n=2, max_tokens=4, seed=3)),
        ("chat_stream_priority", spec("chat_stream_priority", messages=FRANCE, temperature=0.0, max_tokens=3,
                                      priority=1, extensions=frozenset({"priority"}))),
    ]


def raw_cases(engine: str) -> list[tuple[str, str, str, Any]]:
    """Requests not built by a plugin: errors and side endpoints, for the mapping tests."""
    cases: list[tuple[str, str, str, Any]] = [
        ("health", "GET", "/health", None),
        ("models", "GET", "/v1/models", None),
        ("tokenize_prompt", "POST", "/tokenize",
         {"model": MODEL, "prompt": "Hello there"} if engine == "vllm" else {"content": "Hello there"}),
        ("detokenize", "POST", "/detokenize",
         {"model": MODEL, "tokens": [19556, 665]} if engine == "vllm" else {"tokens": [19556, 665]}),
        ("error_unknown_model", "POST", "/v1/chat/completions",
         {"model": "no-such-model", "messages": FRANCE, "max_tokens": 2, "stream": True}),
        ("error_bad_temperature", "POST", "/v1/chat/completions",
         {"model": MODEL, "messages": FRANCE, "max_tokens": 2, "temperature": "hot", "stream": True}),
    ]
    if engine == "vllm":
        cases += [
            ("error_max_tokens_over_context", "POST", "/v1/chat/completions",
             {"model": MODEL, "messages": FRANCE, "max_tokens": 100000, "stream": True}),
            ("tokenize_messages", "POST", "/tokenize", {"model": MODEL, "messages": FRANCE, "add_special_tokens": False,
                                                         "return_token_strs": True}),
            ("error_bad_json_schema_stream", "POST", "/v1/chat/completions",
             {"model": MODEL, "messages": FRANCE, "max_tokens": 5, "stream": True,
              "structured_outputs": {"json": {"type": "nonsense-type"}}}),
        ]
    else:
        cases += [
            ("props", "GET", "/props", None),
            ("apply_template", "POST", "/apply-template", {"messages": FRANCE}),
            ("chat_n2_nonstream", "POST", "/v1/chat/completions",
             {"model": MODEL, "messages": FRANCE, "max_tokens": 2, "n": 2}),  # b11434 allows n <= -np
        ]
    return cases


async def _send(client: httpx.AsyncClient, method: str, path: str, body: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if body is not None:
        kwargs["content"] = json.dumps(body).encode()
        kwargs["headers"] = {"content-type": "application/json"}
    request = client.build_request(method, path, **kwargs)
    started = time.monotonic()
    response = await client.send(request, stream=True)
    chunks: list[bytes] = []
    try:
        async for piece in response.aiter_raw():
            chunks.append(piece)
    finally:
        await response.aclose()
    raw = b"".join(chunks)
    return {
        "status": response.status_code,
        "content_type": response.headers.get("content-type", ""),
        "body": raw.decode("utf-8"),
        "chunk_sizes": [len(c) for c in chunks],
        "elapsed_s": round(time.monotonic() - started, 3),
    }


def _spec_fields(s: RequestSpec) -> dict[str, Any]:
    import msgspec

    data = msgspec.to_builtins(s)
    return {k: v for k, v in data.items() if v not in (None, [], {}, "")}


async def record(engine: str, base_url: str, version: str, only: set[str] | None) -> list[Path]:
    backend: ProxyBackend
    if engine == "vllm":
        backend = VLLMBackend("rec", VLLMOptions(base_url=base_url))
        cases = common_cases() + vllm_cases()
    else:
        backend = LlamaCppBackend("rec", LlamaCppOptions(base_url=base_url))
        cases = common_cases()
    out_dir = OUT / engine
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(300.0), trust_env=False,
                                 headers={"accept-encoding": "identity"}) as client:
        for name, s in cases:
            if only and name not in only:
                continue
            body = backend.build_body(s)
            path = "/v1/chat/completions" if s.kind == "chat" else "/v1/completions"
            result = await _send(client, "POST", path, body)
            doc = {"engine": engine, "engine_version": version, "case": name, "method": "POST", "path": path,
                   "request": body, "built_by_plugin": True, "spec": _spec_fields(s), **result}
            written.append(_write(out_dir / f"{name}.json", doc))
        for name, method, path, body in raw_cases(engine):
            if only and name not in only:
                continue
            result = await _send(client, method, path, body)
            doc = {"engine": engine, "engine_version": version, "case": name, "method": method, "path": path,
                   "request": body, "built_by_plugin": False, **result}
            written.append(_write(out_dir / f"{name}.json", doc))
    return written


def _write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"  {path.relative_to(ROOT)}: HTTP {doc['status']}, {len(doc['chunk_sizes'])} reads, {doc['elapsed_s']} s",
          flush=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(parser)
    parser.add_argument("--case", action="append", help="only these case names (repeatable)")
    args = parser.parse_args(argv)
    only = set(args.case) if args.case else None
    for engine in chosen_engines(args):
        with engine_server(engine, args, vllm={"max_model_len": VLLM_MAX_MODEL_LEN, "enforce_eager": True},
                           llamacpp={"ctx_size": LLAMACPP_CTX, "parallel": LLAMACPP_SLOTS}) as (url, version):
            asyncio.run(record(engine, url, version, only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
