"""Fixtures for the fleet tests: real llama.cpp replicas (one thread, a small context each; a
replica starts in well under a second), bound to distinct loopback addresses 127.0.0.x on one
port so that a DNS name can list them; a real DNS server on loopback (dnslib) whose records a
test changes; and proxy backends over them, driven in the test's own event loop. The replicas
serve tests/e2e/test_fleet_replicas.py, which imports these fixtures.

Skipped only when llama.cpp's install step has not run (`python -m engines.install llamacpp`,
which `make test` runs first)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from engines import install
from engines.launch import ServerProcess, start_llamacpp
from plugins.contract.protocol import RequestSpec, Sampling

MODEL = "smollm2-135m-instruct"
CTX = 4096  # two slots of 2048 tokens


def llamacpp_or_skip() -> None:
    if not install.llamacpp_installed():
        pytest.skip("llama.cpp is not installed; run `python -m engines.install llamacpp`")


def port_free_on(hosts: list[str]) -> int:
    """A TCP port that is free on every one of these loopback addresses."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        try:
            for host in hosts[1:]:
                with socket.socket() as s:
                    s.bind((host, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on all of " + ", ".join(hosts))


def start_replica(host: str, port: int, log_dir: Path) -> ServerProcess:
    return start_llamacpp(alias=MODEL, host=host, port=port, ctx_size=CTX, parallel=2, threads=1, log_dir=log_dir,
                          extra=["--cache-ram", "256"])


@contextmanager
def replicas(n: int, log_dir: Path, *, first: int = 2) -> Iterator[list[ServerProcess]]:
    """`n` llama-servers on 127.0.0.<first>.. sharing one port; stopped on exit."""
    llamacpp_or_skip()
    hosts = [f"127.0.0.{first + i}" for i in range(n)]
    port = port_free_on(hosts)
    started: list[ServerProcess] = []
    try:
        for host in hosts:
            started.append(start_replica(host, port, log_dir))
        yield started
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="module")
def three_replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    with replicas(3, tmp_path_factory.mktemp("replicas")) as servers:
        yield servers


def chat(text: str, *, system: str | None = None, max_tokens: int = 4, request_id: str = "r", **fields: Any) -> RequestSpec:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return RequestSpec(request_id=request_id, kind="chat", model=MODEL, upstream_model=MODEL,
                       sampling=Sampling(temperature=0.0, max_tokens=max_tokens, **fields.pop("sampling", {})),
                       messages=messages, **fields)


def tenant_prompt(tenant: int, chars: int = 3000) -> str:
    """A long system prompt of its own per tenant (no shared preamble)."""
    words = [f"tenant{tenant}-rule{i} keeps wagon {i * 7 + tenant} on siding {i % 11}." for i in range(400)]
    return (f"[{tenant}] " + " ".join(words))[:chars]


class DnsZone:
    """A real DNS server (dnslib, UDP on 127.0.0.1) answering A records from `records`, which a
    test changes while it runs; every other name is NXDOMAIN."""

    def __init__(self) -> None:
        from dnslib import QTYPE, RCODE, RR, A
        from dnslib.server import BaseResolver, DNSServer

        zone = self
        self.records: dict[str, list[str]] = {}
        self._lock = threading.Lock()

        class Resolver(BaseResolver):
            def resolve(self, request: Any, handler: Any) -> Any:
                reply = request.reply()
                name = str(request.q.qname).rstrip(".")
                with zone._lock:
                    addresses = zone.records.get(name)
                if addresses is None:
                    reply.header.rcode = RCODE.NXDOMAIN
                elif request.q.qtype == QTYPE.A:
                    for address in addresses:
                        reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(address), ttl=0))
                return reply

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = DNSServer(Resolver(), port=self.port, address="127.0.0.1")
        self.server.start_thread()

    @property
    def resolver(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set(self, name: str, addresses: list[str]) -> None:
        with self._lock:
            self.records[name] = list(addresses)

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture
def dns_zone() -> Iterator[DnsZone]:
    zone = DnsZone()
    try:
        yield zone
    finally:
        zone.stop()
