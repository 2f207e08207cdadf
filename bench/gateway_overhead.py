"""What the HTTP gateway adds on top of a backend: the same requests sent (a) directly to an
in-process trivial backend and (b) through a real Switchyard server on loopback, at several
concurrency levels. Prints p50/p99 added latency per non-streaming request and per streamed
chunk, and requests/s.

The client is a minimal keep-alive HTTP/1.1 client on raw asyncio streams, so that the client's
own cost (which shares this machine's cores with the server) stays small and stable.

    python bench/gateway_overhead.py [--smoke] [--requests N] [--tokens T]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plugins.protocol import RequestSpec, SamplingParams  # noqa: E402
from tests.support.echo_backend import EchoBackend, EchoOptions  # noqa: E402
from tests.support.server import echo_config, running_server  # noqa: E402


def message(tokens: int) -> str:
    return " ".join(f"w{i}" for i in range(tokens))


def body(tokens: int, stream: bool) -> bytes:
    payload = {"model": "echo-1", "messages": [{"role": "user", "content": message(tokens)}], "stream": stream}
    return json.dumps(payload).encode()


class Connection:
    """One keep-alive HTTP/1.1 connection that posts JSON and reads plain or chunked bodies."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer, f"{host}:{port}")

    async def post(self, path: str, data: bytes) -> tuple[float, list[float]]:
        """Returns (seconds to complete, arrival time of each body chunk after the request)."""
        start = time.perf_counter()
        self.writer.write(
            b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % (path.encode(), self.host.encode(), len(data))
            + data
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace"))
        arrivals: list[float] = []
        lower = head.lower()
        if b"transfer-encoding: chunked" in lower:
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                arrivals.append(time.perf_counter() - start)
                del chunk
        else:
            length = int(lower.split(b"content-length: ")[1].split(b"\r\n")[0])
            await self.reader.readexactly(length)
            arrivals.append(time.perf_counter() - start)
        return time.perf_counter() - start, arrivals

    def close(self) -> None:
        self.writer.close()


async def direct_run(backend: EchoBackend, tokens: int, stream: bool, concurrency: int, requests: int) -> list[float]:
    spec = RequestSpec(
        request_id="bench",
        kind="chat",
        model="echo-1",
        upstream_model="echo-1",
        sampling=SamplingParams(),
        messages=[{"role": "user", "content": message(tokens)}],
        stream=stream,
    )
    latencies: list[float] = []

    async def worker(count: int) -> None:
        for _ in range(count):
            start = time.perf_counter()
            async for _event in backend.generate(spec):
                pass
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(worker(requests // concurrency) for _ in range(concurrency)))
    return latencies


async def gateway_run(port: int, tokens: int, stream: bool, concurrency: int, requests: int) -> tuple[list[float], float]:
    data = body(tokens, stream)
    latencies: list[float] = []
    conns = [await Connection.open("127.0.0.1", port) for _ in range(concurrency)]

    async def worker(conn: Connection, count: int) -> None:
        for _ in range(count):
            elapsed, _ = await conn.post("/v1/chat/completions", data)
            latencies.append(elapsed)

    for conn in conns:  # warm each connection once
        await conn.post("/v1/chat/completions", data)
    start = time.perf_counter()
    await asyncio.gather(*(worker(c, requests // concurrency) for c in conns))
    wall = time.perf_counter() - start
    for conn in conns:
        conn.close()
    return latencies, wall


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main_async(args: argparse.Namespace) -> dict:
    backend = EchoBackend("echo", EchoOptions())
    results = []
    with tempfile.TemporaryDirectory() as tmp, running_server(echo_config(), Path(tmp)) as base:
        port = int(base.rsplit(":", 1)[1])
        for stream in (False, True):
            for concurrency in args.concurrency:
                requests = max(args.requests, concurrency) // concurrency * concurrency
                direct = await direct_run(backend, args.tokens, stream, concurrency, requests)
                through, wall = await gateway_run(port, args.tokens, stream, concurrency, requests)
                row = {
                    "stream": stream,
                    "concurrency": concurrency,
                    "requests": requests,
                    "direct_p50_ms": pct(direct, 0.5) * 1e3,
                    "gateway_p50_ms": pct(through, 0.5) * 1e3,
                    "gateway_p99_ms": pct(through, 0.99) * 1e3,
                    "added_p50_ms": (pct(through, 0.5) - pct(direct, 0.5)) * 1e3,
                    "added_p99_ms": (pct(through, 0.99) - pct(direct, 0.99)) * 1e3,
                    "requests_per_s": requests / wall,
                }
                if stream:
                    chunks = args.tokens + 3  # role chunk, tokens, [DONE]
                    row["added_per_chunk_p50_us"] = row["added_p50_ms"] * 1e3 / chunks
                    row["added_per_chunk_p99_us"] = row["added_p99_ms"] * 1e3 / chunks
                results.append(row)
                print(_format(row), flush=True)
    return {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "python": platform.python_version()},
        "tokens_per_response": args.tokens,
        "rows": results,
    }


def _format(row: dict) -> str:
    kind = "stream" if row["stream"] else "json  "
    text = (
        f"{kind} c={row['concurrency']:<3} n={row['requests']:<5} added p50 {row['added_p50_ms']:7.3f} ms  "
        f"p99 {row['added_p99_ms']:7.3f} ms  {row['requests_per_s']:8.1f} req/s"
    )
    if row["stream"]:
        text += f"  per chunk p50 {row['added_per_chunk_p50_us']:6.1f} us  p99 {row['added_per_chunk_p99_us']:6.1f} us"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="a few seconds, to keep the script from rotting")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gateway_overhead.json")
    args = parser.parse_args()
    if args.smoke:
        args.requests, args.tokens, args.concurrency = 32, 4, [1, 4]
    report = asyncio.run(main_async(args))
    if not args.smoke:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
