"""Memory: (1) the gateway's peak RSS while it carries 256 concurrent streams, Switchyard against
LiteLLM (same bench upstream as bench/gateway_overhead.py, slow enough that all streams are
open at once); (2) the built-in engine's KV-cache bytes per token, read from the tensors it
allocates, against the theoretical 2 x layers x kv_heads x head_dim x dtype size.

    .venv/bin/python bench/memory.py            # ~1 min
    .venv/bin/python bench/memory.py --smoke    # tiny model, 16 streams
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.arms import MODEL, Arm, arm_versions, started_arms  # noqa: E402
from bench.common import (  # noqa: E402
    RESULTS,
    Connection,
    ResourceMeter,
    chat_body,
    dist_version,
    load_average,
    load_note,
    median_of_rows,
    print_header,
    tree_rss,
    uptime_line,
    use_uvloop,
    vm_hwm,
    write_result,
)

ARMS = ("switchyard", "litellm")


async def hold_streams(arm: Arm, streams: int, tokens: int) -> dict:
    conns = await asyncio.gather(*(Connection.open(arm.port, headers=arm.headers) for _ in range(streams)))
    await asyncio.gather(*(c.post(arm.path, chat_body(MODEL, stream=True, max_tokens=2)) for c in conns))  # warm
    await asyncio.sleep(0.5)
    idle = tree_rss(arm.pid)  # type: ignore[arg-type]
    data = chat_body(MODEL, stream=True, max_tokens=tokens)
    with ResourceMeter(arm.pid, interval=0.02) as meter:
        start = time.perf_counter()
        timings = await asyncio.gather(*(c.post(arm.path, data) for c in conns), return_exceptions=True)
        wall = time.perf_counter() - start
    for c in conns:
        c.close()
    errors = sum(isinstance(t, BaseException) for t in timings)
    return {"arm": arm.name, "streams": streams, "errors": errors, "idle_rss_mib": idle / 2**20,
            "peak_rss_mib": meter.peak_rss / 2**20, "per_stream_kib": (meter.peak_rss - idle) / streams / 1024,
            "vm_hwm_mib": (vm_hwm(arm.pid) or 0) / 2**20, "wall_s": wall, "cpu_s": meter.cpu_s,
            "load1": load_average()[0]}


def kv_cache_bytes(model_dir: Path, dtype: str, kv_tokens: int) -> dict:
    from builtin_engine.config import EngineConfig
    from builtin_engine.engine import LLMEngine

    engine = LLMEngine.from_model_dir(model_dir, config=EngineConfig(dtype=dtype, kv_cache_tokens=kv_tokens,
                                                                     max_model_len=min(kv_tokens, 2048)))
    cache = engine.runner.kv_cache
    tensors = [*cache.keys, *cache.values]
    allocated = sum(t.numel() * t.element_size() for t in tensors)
    cfg = engine.model_config
    slots = engine.config.num_kv_blocks * engine.config.block_size
    pad_slots = (tensors[0].shape[0] - engine.config.num_kv_blocks) * engine.config.block_size  # the graphs' pad block
    element = tensors[0].element_size()
    theory = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * element
    return {"dtype": dtype, "layers": cfg.num_layers, "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
            "dtype_bytes": element, "token_slots": slots, "pad_slots": pad_slots, "allocated_bytes": allocated,
            "bytes_per_token": allocated / slots, "theoretical_bytes_per_token": theory,
            "ratio_to_theory": allocated / slots / theory, "tensor_shape": list(tensors[0].shape),
            "tensors": len(tensors)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=100, help="per stream; with --pace-ms, how long streams stay open")
    parser.add_argument("--pace-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default=None, help="for the KV cache figure (default: the default model)")
    parser.add_argument("--kv-tokens", type=int, default=16384, help="the engine's kv_cache_tokens (its default)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.streams, args.tokens, args.pace_ms, args.repeats, args.kv_tokens = 16, 10, 5.0, 1, 1024
    versions = {**arm_versions(), "torch": dist_version("torch"), "client": use_uvloop()}
    info = print_header("memory: gateway RSS under concurrent streams; KV cache bytes per token", versions)
    load0 = load_average()

    rows = []
    with started_arms(args.arms, tokens=args.tokens, pace_ms=args.pace_ms) as (_u, arms):
        skipped = [a for a in args.arms if a not in arms]
        for name in [a for a in ARMS if a in arms]:
            runs = [asyncio.run(hold_streams(arms[name], args.streams, args.tokens)) for _ in range(args.repeats)]
            row = median_of_rows(runs)
            rows.append(row)
            print(f"{name:<10} {args.streams} streams: idle {row['idle_rss_mib']:.1f} MiB, peak {row['peak_rss_mib']:.1f} "
                  f"MiB ({row['per_stream_kib']:.1f} KiB per stream), VmHWM {row['vm_hwm_mib']:.1f} MiB, "
                  f"errors {row['errors']}", flush=True)
    if len(rows) == 2:
        print(f"Switchyard / LiteLLM peak RSS: {rows[0]['peak_rss_mib'] / rows[1]['peak_rss_mib']:.2f}x")

    if args.smoke and args.model is None:
        from tests.fixtures_models import cached_tiny_model

        model_dir = cached_tiny_model()
    else:
        from builtin_engine.model.store import resolve_model

        model_dir = resolve_model(args.model or "smollm2-135m-instruct")
    kv = []
    for dtype in ("float32", "bfloat16"):
        k = kv_cache_bytes(model_dir, dtype, args.kv_tokens)
        kv.append(k)
        print(f"builtin KV cache {dtype}: {k['bytes_per_token']:.0f} B/token allocated ({k['tensors']} tensors "
              f"{k['tensor_shape']}), theory 2 x {k['layers']} x {k['kv_heads']} x {k['head_dim']} x "
              f"{k['dtype_bytes']} = {k['theoretical_bytes_per_token']} B/token -> {k['ratio_to_theory']:.3f}x "
              f"(incl. a {k['pad_slots']}-slot pad block)",
              flush=True)
    load1 = load_average()
    report = {"machine": info, "versions": versions, "skipped_arms": skipped, "model_dir": str(model_dir),
              "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "gateway_rss": rows, "kv_cache": kv, "model_config": json.loads((model_dir / "config.json").read_text()).get("architectures"),
              "load_before": load0, "load_after": load1, "load_note": load_note(load0, load1), "uptime_after": uptime_line()}
    write_result("memory", report, results_dir=args.results_dir, smoke=args.smoke)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
