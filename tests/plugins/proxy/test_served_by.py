"""Which replica served a proxied request, without an engine (the recording faulty upstream, and a
port nobody listens on): the stream says it (`served_by`), and the request log records it — the
replica that answered after another failed before the first byte, the replica tried last when
none answered, the same through a reasoning parser, and for a shadow copy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.chat_api.encode import collect, open_stream
from gateway.config import parse_config
from gateway.service.gateway import Gateway
from plugins.contract.errors import UpstreamError
from plugins.contract.protocol import RequestSpec, Sampling, Usage
from plugins.proxy.vllm import VLLMBackend, VLLMOptions
from tests.support import faulty_upstream
from tests.support.faulty_upstream import FaultyUpstream
from tests.support.server import free_port

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultyUpstream]:
    up = faulty_upstream.start()
    try:
        yield up
    finally:
        faulty_upstream.stop(up)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def dead() -> str:
    return f"http://127.0.0.1:{free_port()}"


def spec(model: str, request_id: str = "r") -> RequestSpec:
    return RequestSpec(request_id=request_id, kind="chat", model=model, upstream_model=model,
                       sampling=Sampling(max_tokens=8), messages=[{"role": "user", "content": "which replica"}])


def fleet(*urls: str, **options: Any) -> VLLMBackend:
    return VLLMBackend("fleet", msgspec.convert({"endpoints": list(urls), "balance": "round_robin",
                                                 "models": {"m": "up"}, "timeouts": {"connect_s": 1.0}, **options},
                                                VLLMOptions))


@pytest.mark.parametrize("reasoning_parser", ["none", "deepseek_r1"])
async def test_the_stream_says_which_replica_served(upstream: FaultyUpstream, dead: str, reasoning_parser: str) -> None:
    backend = fleet(dead, upstream.url, reasoning_parser=reasoning_parser)
    await backend.start()
    try:
        for i in range(2):  # round robin: one of the two starts on the dead replica
            stream = backend.generate(spec("m", f"r{i}"))
            assert getattr(stream, "served_by", "missing") is None  # nothing sent yet
            events = [event async for event in stream]
            assert isinstance(events[-1], Usage)
            assert stream.served_by == upstream.url  # type: ignore[attr-defined]
    finally:
        await backend.close()


async def test_after_a_failure_the_stream_names_the_replica_tried_last(dead: str) -> None:
    backend = fleet(dead)
    await backend.start()
    try:
        stream = backend.generate(spec("m"))
        with pytest.raises(UpstreamError):
            [event async for event in stream]
        assert stream.served_by == dead  # type: ignore[attr-defined]
    finally:
        await backend.close()


def config(log: Path, upstream: str, dead: str) -> str:
    def backend(name: str, urls: list[str], **options: str) -> str:
        extra = "".join(f'{k} = "{v}"\n' for k, v in options.items())
        return (f'[[backends]]\nname = "{name}"\ntype = "vllm"\n[backends.options]\n'
                f'endpoints = {json.dumps(urls)}\nbalance = "round_robin"\nmodels = {{ "m-{name}" = "up" }}\n{extra}'
                "[backends.options.timeouts]\nconnect_s = 1.0\n\n")

    return (f'[server]\nrequest_log = "{log}"\nhealth_interval_s = 0\nbreaker_failures = 1000\n\n'
            '[plugins]\ndisable = ["builtin"]\n\n'
            + backend("fleet", [dead, upstream]) + backend("gone", [dead])
            + backend("thinking", [dead, upstream], reasoning_parser="deepseek_r1")
            + '[[routes]]\nname = "mirrored"\nshadow = { backend = "thinking", model = "m-thinking" }\n'
            '[[routes.targets]]\nbackend = "fleet"\nmodel = "m-fleet"\n')


async def test_the_request_log_names_the_replica(tmp_path: Path, upstream: FaultyUpstream, dead: str) -> None:
    log = tmp_path / "log.jsonl"
    gateway = Gateway.from_config(parse_config(config(log, upstream.url, dead), "test.toml"))
    await gateway.start()
    try:
        for i in range(2):  # round robin: one of each pair starts on the dead replica
            await collect(gateway, spec("m-fleet", f"collected-{i}"))
            opened = await open_stream(gateway, spec("m-thinking", f"streamed-{i}"))
            assert b"[DONE]" in b"".join([chunk async for chunk in opened.body])
        with pytest.raises(UpstreamError):
            await collect(gateway, spec("m-gone", "failed"))
        await collect(gateway, spec("mirrored", "mirrored"))
        while gateway.shadow_tasks:
            await gateway.shadow_tasks.pop()
    finally:
        await gateway.close()
    lines = {(line["request_id"], line["shadow"]): line for line in map(json.loads, log.read_text().splitlines())}
    replicas = {key: line.get("replica") for key, line in lines.items()}
    assert replicas == {
        **{(f"{kind}-{i}", False): upstream.url for kind in ("collected", "streamed") for i in range(2)},
        ("failed", False): dead,
        ("mirrored", False): upstream.url,
        ("mirrored-shadow", True): upstream.url,
    }
    assert lines[("failed", False)]["outcome"] != "ok"
