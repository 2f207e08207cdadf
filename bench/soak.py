"""Soak: a gateway under steady mixed traffic for ten minutes; does its memory stay flat?

One `switchyard serve` process in front of the test suite's faulty upstream process
(tests/support/faulty_upstream.py, through the `vllm` plugin: httpx pools, the SSE parser, the
normalizer — the path a real deployment runs) or, with `--backend echo`, of the in-process echo
backend. `--concurrency` closed-loop clients on raw asyncio keep it busy with a mix that walks
the error paths too, where leaks like to hide:

    68% streams, 15% non-streaming, 5% clients that hang up mid-stream, 4% upstream 500s,
    4% upstreams that die mid-stream, 4% malformed upstream events

The gateway's RSS (VmRSS, /proc) is sampled every `--sample-s`; after `--warmup-s` a least-squares
line through the samples gives the slope in MiB per minute (and per 10,000 requests). The
verdict is "flat" when the fitted growth over the run is under `--tolerance-mib`.

    .venv/bin/python bench/soak.py                       # 10 minutes
    .venv/bin/python bench/soak.py --duration 90         # a short run
    .venv/bin/python bench/soak.py --backend echo --concurrency 64

Writes bench/results/soak.json (soak.short.json for runs under 10 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import faulty_upstream  # noqa: E402
from tests.support.server import free_port  # noqa: E402
from tests.support.sse_client import post  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MIX = [  # (weight, kind, prompt, stream)
    (68, "stream", "soak words go by one two three four five six seven eight", True),
    (15, "json", "soak words go by one two three four", False),
    (5, "hangup", "fault:slow", True),
    (4, "upstream_500", "fault:status:500", True),
    (4, "die_mid_stream", "a b fault:die_mid_stream", True),
    (4, "malformed", "a b fault:malformed_after", True),
]


def gateway_config(backend: str, upstream_url: str | None) -> str:
    head = '[server]\nlog_level = "warning"\nhealth_interval_s = 5\nbreaker_failures = 1000000\n\n'
    if backend == "echo":
        return head + ('[plugins]\ndisable = ["builtin"]\nmodules = ["tests.support.echo_backend"]\n\n'
                       '[[backends]]\nname = "soak"\ntype = "echo"\n[backends.options]\nmodels = ["soak"]\n'
                       "token_delay_s = 0.002\nmax_model_len = 4096\n")
    return head + f"""[plugins]
disable = ["builtin"]

[[backends]]
name = "soak"
type = "vllm"
[backends.options]
base_url = "{upstream_url}"
models = {{ "soak" = "up" }}
[backends.options.timeouts]
first_byte_s = 5.0
idle_s = 5.0
"""


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


async def hang_up(port: int, payload: dict) -> str:
    """A client that reads the start of a stream, then closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(payload).encode()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n%s" % (len(data), data))
    try:
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        got = 0
        while got < 600:
            piece = await asyncio.wait_for(reader.read(4096), 10)
            if not piece:
                break
            got += len(piece)
        return "ok"
    except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
        return f"error:{type(exc).__name__}"
    finally:
        writer.close()


async def client(port: int, stop_at: float, counts: Counter, backend: str, rng: random.Random) -> None:
    weights = [w for w, *_ in MIX]
    while time.monotonic() < stop_at:
        _, kind, prompt, stream = rng.choices(MIX, weights)[0]
        if backend == "echo" and kind not in ("stream", "json"):
            kind, prompt, stream = "stream", MIX[0][2], True
        payload = {"model": "soak", "messages": [{"role": "user", "content": prompt}], "stream": stream, "max_tokens": 600}
        if kind == "hangup":
            outcome = await hang_up(port, payload)
        else:
            answer = await post("127.0.0.1", port, "/v1/chat/completions", payload, timeout=30)
            expect_error = kind in ("upstream_500", "die_mid_stream", "malformed")
            if answer.error:
                outcome = "client_error"
            elif answer.status != 200:
                outcome = "ok" if expect_error and answer.status in (500, 502) else f"http_{answer.status}"
            elif stream and answer.body.endswith(b"data: [DONE]\n\n"):
                outcome = "ok" if (b'"error"' in answer.body) == expect_error else "wrong_outcome"
            elif not stream:
                outcome = "ok"
            else:
                outcome = "truncated"
        counts[kind] += 1
        counts["unexpected"] += outcome != "ok"


async def drive(port: int, pid: int, args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    counts: Counter = Counter()
    start = time.monotonic()
    stop_at = start + args.duration
    clients = [asyncio.create_task(client(port, stop_at, counts, args.backend, random.Random(rng.random())))
               for _ in range(args.concurrency)]
    samples: list[dict] = []
    while time.monotonic() < stop_at:
        now = time.monotonic() - start
        requests = sum(v for k, v in counts.items() if k != "unexpected")
        samples.append({"t_s": round(now, 1), "rss_mib": round(rss_bytes(pid) / 2**20, 2), "requests": requests})
        print(f"  t={now:6.0f}s  rss={samples[-1]['rss_mib']:7.1f} MiB  requests={requests}", flush=True)
        await asyncio.sleep(min(args.sample_s, max(0.0, stop_at - time.monotonic())))
    await asyncio.gather(*clients)
    end = time.monotonic() - start
    samples.append({"t_s": round(end, 1), "rss_mib": round(rss_bytes(pid) / 2**20, 2),
                    "requests": sum(v for k, v in counts.items() if k != "unexpected")})
    return {"samples": samples, "counts": dict(counts), "elapsed_s": end}


def report(result: dict, args: argparse.Namespace) -> dict:
    samples = result["samples"]
    steady = [s for s in samples if s["t_s"] >= args.warmup_s] or samples
    per_s = slope([(s["t_s"], s["rss_mib"]) for s in steady])
    per_req = slope([(s["requests"], s["rss_mib"]) for s in steady])
    growth = per_s * (steady[-1]["t_s"] - steady[0]["t_s"])
    requests = samples[-1]["requests"]
    return {
        "backend": args.backend,
        "duration_s": round(result["elapsed_s"], 1),
        "concurrency": args.concurrency,
        "requests": requests,
        "requests_per_s": round(requests / result["elapsed_s"], 1),
        "unexpected_outcomes": result["counts"].get("unexpected", 0),
        "mix": {k: v for k, v in result["counts"].items() if k != "unexpected"},
        "rss_start_mib": samples[0]["rss_mib"],
        "rss_after_warmup_mib": steady[0]["rss_mib"],
        "rss_end_mib": samples[-1]["rss_mib"],
        "rss_max_mib": max(s["rss_mib"] for s in samples),
        "slope_mib_per_min": round(per_s * 60, 3),
        "slope_mib_per_10k_requests": round(per_req * 10_000, 3),
        "fitted_growth_mib": round(growth, 2),
        "verdict": "flat" if abs(growth) < args.tolerance_mib else "growing",
        "warmup_s": args.warmup_s,
        "samples": samples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--backend", choices=("proxy", "echo"), default="proxy")
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--warmup-s", type=float, default=None, help="samples before this are left out of the fit (default: 10%% of the run, at least 10 s)")
    parser.add_argument("--tolerance-mib", type=float, default=5.0, help="fitted growth under this is flat")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.warmup_s is None:
        args.warmup_s = max(10.0, args.duration * 0.1)

    tmp = Path(tempfile.mkdtemp(prefix="switchyard-soak-"))
    upstream = faulty_upstream.start(str(tmp / "upstream.log")) if args.backend == "proxy" else None
    config = tmp / "plugins.toml"
    config.write_text(gateway_config(args.backend, upstream.url if upstream else None))
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = (tmp / "gateway.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port),
                             "--drain-seconds", "2"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = asyncio.run(post("127.0.0.1", port, "/v1/chat/completions",
                                          {"model": "soak", "messages": [{"role": "user", "content": "warm"}]}, timeout=5))
                if answer.status == 200:
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gateway did not start:\n{(tmp / 'gateway.log').read_text()[-3000:]}")
            time.sleep(0.2)
        print(f"soak: {args.duration:g} s, {args.concurrency} clients, backend {args.backend}, gateway pid {proc.pid}")
        result = asyncio.run(drive(port, proc.pid, args))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        if upstream is not None:
            faulty_upstream.stop(upstream)
    out = report(result, args)
    summary = {k: v for k, v in out.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    path = args.out or RESULTS / ("soak.json" if args.duration >= 600 else "soak.short.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"written: {path}")
    return 0 if out["unexpected_outcomes"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
