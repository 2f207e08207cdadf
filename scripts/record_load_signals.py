"""Record what real vLLM and llama.cpp servers report about their own load, for the load-signal
parsers' tests (`tests/plugins/fleet/test_load_signals.py`).

    python scripts/record_load_signals.py                     # start both servers, record, stop them
    python scripts/record_load_signals.py --engine llamacpp   # one engine
    python scripts/record_load_signals.py --vllm-url http://127.0.0.1:8001 --llamacpp-url http://127.0.0.1:8002

Each server is scraped idle, then while `BUSY` streaming requests run on it (llama.cpp runs two
slots, so two of them wait: `requests_deferred`), then idle again after a repeated long prompt
(prefix-cache counters). Each scrape is written to `tests/recordings/load_signals/<engine>_<path>_<when>.json`:

    {"engine", "engine_version", "path", "when": "idle" | "busy" | "after", "in_flight": <requests
     the script had running upstream>, "status", "content_type", "body": <the response text>}

Nothing in these files is written by hand; rerun this script after an engine upgrade.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from scripts.engine_servers import add_engine_args, chosen_engines, engine_server  # noqa: E402

MODEL = "smollm2-135m-instruct"
OUT = ROOT / "tests" / "recordings" / "load_signals"
BUSY = 4
PATHS = {"vllm": ("/metrics",), "llamacpp": ("/metrics", "/slots")}
LONG_SYSTEM = "You are a careful dispatcher for a railway switchyard. " + " ".join(
    f"Rule {i}: wagons on siding {i} wait for the shunting engine before they roll." for i in range(1, 40)
)


def chat(text: str, max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": text}],
            "max_tokens": max_tokens, "temperature": 0.0, "stream": True, "ignore_eos": True}


async def _stream(client: httpx.AsyncClient, body: dict[str, Any], started: asyncio.Event) -> None:
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        async for _ in response.aiter_lines():
            started.set()


async def _scrape(client: httpx.AsyncClient, engine: str, version: str, when: str, in_flight: int) -> None:
    for path in PATHS[engine]:
        response = await client.get(path)
        doc = {"engine": engine, "engine_version": version, "path": path, "when": when, "in_flight": in_flight,
               "status": response.status_code, "content_type": response.headers.get("content-type", ""),
               "body": response.text}
        name = f"{engine}_{path.strip('/')}_{when}.json"
        (OUT / name).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"  tests/recordings/load_signals/{name}: HTTP {response.status_code}, {len(response.text)} chars", flush=True)


async def record(engine: str, base_url: str, version: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(300.0), trust_env=False) as client:
        await _scrape(client, engine, version, "idle", 0)
        started = [asyncio.Event() for _ in range(BUSY)]
        streams = [asyncio.create_task(_stream(client, chat(f"Tell a long story number {i}.", 400), started[i]))
                   for i in range(BUSY)]
        await asyncio.wait([asyncio.create_task(e.wait()) for e in started], return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(0.5)  # every request has reached the engine's queue or a slot
        await _scrape(client, engine, version, "busy", BUSY)
        for task in streams:
            task.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
        for _ in range(2):  # the same long prompt twice: the second one hits the prefix cache
            await _stream(client, {**chat("Which siding waits?", 4), "ignore_eos": False}, asyncio.Event())
        await _scrape(client, engine, version, "after", 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(parser)
    args = parser.parse_args(argv)
    for engine in chosen_engines(args):
        with engine_server(engine, args, vllm={"max_model_len": 2048, "enforce_eager": True},
                           llamacpp={"ctx_size": 4096, "parallel": 2, "threads": 1}) as (url, version):
            asyncio.run(record(engine, url, version))
    return 0


if __name__ == "__main__":
    sys.exit(main())
