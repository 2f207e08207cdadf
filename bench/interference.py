"""Does a busy built-in engine slow the other routes of the same gateway? The engine in the
gateway's process against the engine in a process of its own (`engine_process = true`).

One Switchyard serves two routes: `bench-model`, proxied to the bench's fast upstream
(bench/upstream.py: `--tokens` tokens `--pace-ms` apart), and the built-in engine with the
default model. The proxied route is measured closed loop at `--streams` streams (16), directly
and through the gateway, interleaved, `--repeats` times (medians): once with the engine idle,
and once while a separate client process keeps `--engine-streams` (32) generations running on
the engine. Added latency = through the gateway minus direct under the same load. Each mode
(engine in process, engine process) is a server of its own, started in turn; the engine gets
`--engine-threads` torch threads in both.

Target (issue #17): with the engine process, the proxied route's added p50 while the engine
serves 32 streams is within 1 ms of its added p50 with the engine idle.

    .venv/bin/python bench/interference.py              # ~3 min on 2 cores
    .venv/bin/python bench/interference.py --smoke      # tiny random model, a few seconds per cell
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.arms import Arm, arm_versions, start_upstream, upstream_backend  # noqa: E402
from bench.common import (  # noqa: E402
    RESULTS,
    Connection,
    ClientError,
    chat_body,
    cpu_busy,
    fmt,
    free_port,
    load_average,
    load_note,
    median_of_rows,
    print_header,
    spawn,
    use_uvloop,
    wait_ready,
    write_result,
)
from bench.gateway_overhead import closed_loop  # noqa: E402

ENGINE_MODEL = "smollm2-135m-instruct"
MODES = {"in_process": False, "engine_process": True}


def switchyard_config(upstream_port: int, *, engine_process: bool, model: str, threads: int) -> str:
    return f"""[server]
log_level = "warning"

{upstream_backend(upstream_port)}
[[backends]]
name = "builtin"
type = "builtin"
[backends.options]
model = "{model}"
served_model_name = "{ENGINE_MODEL}"
num_threads = {threads}
engine_process = {"true" if engine_process else "false"}
"""


# ------------------------------------------------------------------ the engine's background load


async def engine_load(port: int, streams: int, max_tokens: int) -> None:
    """Keep `streams` generations running on the built-in route until killed."""
    data = chat_body(ENGINE_MODEL, stream=True, max_tokens=max_tokens, prompt="Tell me a long story about trains.",
                     extra={"ignore_eos": True, "temperature": 0.8})

    async def one() -> None:
        conn = await Connection.open(port)
        while True:
            try:
                await conn.post("/v1/chat/completions", data)
            except (ClientError, OSError, asyncio.IncompleteReadError):
                conn.close()
                conn = await Connection.open(port)

    await asyncio.gather(*(one() for _ in range(streams)))


def engine_streams(port: int) -> float:
    """The built-in backend's requests in flight (the gateway's /metrics)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("switchyard_requests_in_flight{") and 'backend="builtin"' in line)


# ------------------------------------------------------------------------------------- cells


async def measure(arms: dict[str, Arm], args: argparse.Namespace, condition: str) -> dict:
    runs: dict[str, list[dict]] = {name: [] for name in arms}
    requests = args.streams * args.per_connection
    for rep in range(args.repeats):
        names = list(arms)
        for name in names[rep % 2:] + names[: rep % 2]:
            row = await closed_loop(arms[name], stream=True, concurrency=args.streams, requests=requests,
                                    tokens=args.tokens, max_seconds=args.max_cell_seconds)
            runs[name].append(row)
    rows = {name: median_of_rows(r) for name, r in runs.items()}
    direct, sy = rows["direct"], rows["switchyard"]
    cell = {"condition": condition, "direct": direct, "switchyard": sy,
            "added_p50_ms": sy["p50_ms"] - direct["p50_ms"], "added_p99_ms": sy["p99_ms"] - direct["p99_ms"],
            "added_ttft_p50_ms": sy["ttft_p50_ms"] - direct["ttft_p50_ms"]}
    print(f"  {condition:<12} direct p50 {direct['p50_ms']:7.2f} p99 {direct['p99_ms']:7.2f} ms | Switchyard p50 "
          f"{sy['p50_ms']:7.2f} p99 {sy['p99_ms']:7.2f} ms | added p50 {cell['added_p50_ms']:+7.2f} p99 "
          f"{cell['added_p99_ms']:+7.2f} ttft50 {cell['added_ttft_p50_ms']:+7.2f} ms", flush=True)
    return cell


async def run_mode(mode: str, args: argparse.Namespace, upstream_port: int, log_dir: Path, model: str) -> dict:
    config = log_dir / f"switchyard-{mode}.toml"
    config.write_text(switchyard_config(upstream_port, engine_process=MODES[mode], model=model, threads=args.engine_threads))
    port = free_port()
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--host", "127.0.0.1",
            "--port", str(port), "--drain-seconds", "1"]
    with ExitStack() as stack:
        server = spawn(f"switchyard-{mode}", argv, port=port, log_dir=log_dir)
        stack.callback(server.stop)
        wait_ready(server, "/ready", timeout=600)
        arms = {"direct": Arm("direct", upstream_port, "/v1/chat/completions", {}, None),
                "switchyard": Arm("switchyard", port, "/v1/chat/completions", {}, server)}
        print(f"{mode}: engine {'in its own process' if MODES[mode] else 'in the gateway process'}", flush=True)
        await closed_loop(arms["switchyard"], stream=True, concurrency=args.streams, requests=args.streams * 2,
                          tokens=args.tokens, max_seconds=10)  # warm
        idle = await measure(arms, args, "engine idle")
        background = spawn(f"engine-load-{mode}", [sys.executable, __file__, "--background-port", str(port),
                                                   "--engine-streams", str(args.engine_streams),
                                                   "--engine-max-tokens", str(args.engine_max_tokens)],
                           port=port, log_dir=log_dir)
        stack.callback(background.stop)
        started = time.monotonic()
        while engine_streams(port) < args.engine_streams:  # all admitted (prefill is engine work too)
            if background.proc.poll() is not None or time.monotonic() - started > 600:
                raise RuntimeError(f"the engine load did not start:\n{background.log_tail()}")
            await asyncio.sleep(0.2)
        busy = await measure(arms, args, f"engine {args.engine_streams} streams")
    return {"mode": mode, "idle": idle, "busy": busy, "busy_minus_idle_added_p50_ms": busy["added_p50_ms"] - idle["added_p50_ms"],
            "busy_minus_idle_added_p99_ms": busy["added_p99_ms"] - idle["added_p99_ms"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="the tiny random test model, short cells")
    parser.add_argument("--streams", type=int, default=16, help="streams on the proxied route")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--pace-ms", type=float, default=10.0)
    parser.add_argument("--per-connection", type=int, default=20, help="requests per stream and cell")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-cell-seconds", type=float, default=60.0)
    parser.add_argument("--engine-streams", type=int, default=32)
    parser.add_argument("--engine-max-tokens", type=int, default=256)
    parser.add_argument("--engine-threads", type=int, default=1)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--background-port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    loop_name = use_uvloop()
    if args.background_port is not None:
        asyncio.run(engine_load(args.background_port, args.engine_streams, args.engine_max_tokens))
        return 0
    model = ENGINE_MODEL
    if args.smoke:
        from tests.fixtures_models import make_tiny_model

        model = str(make_tiny_model(Path(tempfile.mkdtemp(prefix="bench-tiny-")) / "tiny"))
        args.per_connection, args.repeats, args.engine_streams, args.tokens = 4, 1, 4, 4
    info = print_header("interference: a proxied route while the built-in engine is busy", {**arm_versions(), "client": loop_name})
    print(f"proxied route: {args.streams} streams, {args.tokens} tokens {args.pace_ms:g} ms apart; engine: "
          f"{args.engine_streams} streams of up to {args.engine_max_tokens} tokens, {args.engine_threads} thread(s)", flush=True)
    load0, busy0 = load_average(), cpu_busy(0.5)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-interference-") as tmp:
        log_dir = Path(tmp)
        upstream = start_upstream(log_dir, tokens=args.tokens, pace_ms=args.pace_ms)
        try:
            for mode in args.modes:
                results.append(asyncio.run(run_mode(mode, args, upstream.port, log_dir, model)))
        finally:
            upstream.stop()
    load1 = load_average()
    by_mode = {r["mode"]: r for r in results}
    targets = {}
    if "engine_process" in by_mode:
        delta = by_mode["engine_process"]["busy_minus_idle_added_p50_ms"]
        targets["engine_process: busy - idle added p50 <= 1 ms"] = {"value": delta, "met": delta <= 1.0}
    print("\nadded p50 on the proxied route, engine busy minus engine idle:")
    for r in results:
        print(f"  {r['mode']:<15} {fmt(r['busy_minus_idle_added_p50_ms'], '+.2f')} ms (p99 {fmt(r['busy_minus_idle_added_p99_ms'], '+.2f')} ms)")
    for name, t in targets.items():
        print(f"  target {name}: {fmt(t['value'], '+.2f')} -> {'met' if t['met'] else 'MISSED'}")
    print(f"  load: {load_note(load0, load1)} (others {busy0 * 100:.0f}% busy before; load {load0[0]:.2f} -> {load1[0]:.2f})")
    report = {"machine": info, "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "results": results, "targets": targets, "load_before": load0, "load_after": load1,
              "load_note": load_note(load0, load1),
              "others_busy_before_pct": busy0 * 100}
    write_result("interference", report, results_dir=args.results_dir, smoke=args.smoke)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
