"""Throughput of the built-in engine against Hugging Face transformers on the same weights.

For each number of concurrent streams (default 1, 8, 32), every stream sends a prompt of
`--prompt-tokens` random token ids and receives exactly `--output-tokens` tokens (greedy,
ignore_eos). Reported per engine: output tokens/s over the whole run (prefill included), mean
time to first token, median inter-token latency.

- builtin: the `LLMEngine` in process, its step thread running, streams submitted together
  through the asyncio API (what the gateway's backend does).
- hf serial: transformers `generate` one request at a time (its throughput does not depend on
  how many streams wait, so it is measured once on a few requests).
- hf batched: transformers `generate` on all streams' prompts as one left-padded batch.

Then, unless `--abort-trials 0`, abort latency of the built-in engine: the time from
`engine.abort()` (what the gateway calls when a client goes away) to the request's blocks being
freed, while the most streams decode, and while a long prompt is being prefilled in chunks.

    .venv/bin/python bench/engine_throughput.py                 # the default model, ~6 min on 2 cores
    .venv/bin/python bench/engine_throughput.py --matmul-dtype bfloat16   # bf16 projections
    .venv/bin/python bench/engine_throughput.py --matmul-dtype float32,bfloat16   # both, side by side
    .venv/bin/python bench/engine_throughput.py --smoke         # the tiny test model, well under a minute
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass
class Result:
    name: str
    streams: int
    tokens_per_s: float
    ttft_s: float | None = None
    itl_s: float | None = None

    def row(self) -> str:
        ttft = f"{self.ttft_s * 1e3:9.0f}" if self.ttft_s is not None else f"{'-':>9}"
        itl = f"{self.itl_s * 1e3:8.1f}" if self.itl_s is not None else f"{'-':>8}"
        return f"{self.name:<14} {self.streams:>7} {self.tokens_per_s:>10.1f} {ttft} {itl}"


def make_prompts(n: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab_size) for _ in range(length)] for _ in range(n)]


def bench_builtin(engine, streams: int, prompt_len: int, output_len: int, seed: int,  # noqa: ANN001
                  name: str = "builtin") -> Result:
    from builtin_engine.scheduling.sampling_params import SamplingParams

    engine.block_manager.reset_prefix_cache()  # no help from earlier runs
    prompts = make_prompts(streams, prompt_len, engine.model_config.vocab_size, seed)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)

    async def one(prompt: list[int], start: float) -> tuple[float, list[float], int]:
        times: list[float] = []
        count = 0
        async for out in engine.generate(prompt, params):
            now = time.perf_counter()
            for choice in out.choices:
                count += len(choice.token_ids)
                times.extend([now] * len(choice.token_ids))
        return times[0] - start, [b - a for a, b in zip(times, times[1:])], count

    async def main() -> tuple[float, list]:
        start = time.perf_counter()
        results = await asyncio.gather(*(one(p, start) for p in prompts))
        return time.perf_counter() - start, results

    elapsed, results = asyncio.run(main())
    total = sum(r[2] for r in results)
    assert total == streams * output_len, (total, streams * output_len)
    itls = [gap for r in results for gap in r[1]]
    return Result(name, streams, total / elapsed, statistics.mean(r[0] for r in results),
                  statistics.median(itls) if itls else None)


def bench_abort_latency(engine, streams: int, prompt_len: int, trials: int, seed: int) -> dict[str, list[float]]:  # noqa: ANN001
    """Seconds from `abort()` to the request's blocks being freed (`engine.abort_latencies`):
    a decoding stream aborted at a random moment while `streams` decode; a long prompt aborted at
    a random moment of its chunked prefill while `streams - 1` decode."""
    from builtin_engine.scheduling.sampling_params import SamplingParams

    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0.0, ignore_eos=True)  # max_tokens: the rest of the context
    long_len = min(4 * engine.scheduler.max_num_batched_tokens, engine.max_model_len - 16)
    results: dict[str, list[float]] = {"decode": [], "prefill": []}
    for kind in results:
        engine.block_manager.reset_prefix_cache()
        decoders = [engine.add_request(p, params) for p in make_prompts(streams - 1, prompt_len, vocab, seed)]
        while engine.num_running_seqs < len(decoders):
            time.sleep(0.01)
        for _ in range(trials):
            if kind == "decode":
                victim = engine.add_request(make_prompts(1, prompt_len, vocab, rng.randrange(1 << 30))[0], params)
                while victim.request_id not in engine.running_request_ids():
                    time.sleep(0.005)
                time.sleep(rng.uniform(0.05, 0.6))  # decoding, at a random point of a step
            else:
                victim = engine.add_request(make_prompts(1, long_len, vocab, rng.randrange(1 << 30))[0], params)
                while victim.request_id not in engine.running_request_ids():
                    time.sleep(0.002)
                time.sleep(rng.uniform(0.0, 0.8))  # somewhere in its chunked prefill
            before = len(engine.abort_latencies)
            engine.abort(victim.request_id)
            while len(engine.abort_latencies) == before:
                time.sleep(0.001)
            results[kind].append(engine.abort_latencies[-1])
        for handle in decoders:
            engine.abort(handle.request_id)
        while engine.num_unfinished_requests:
            time.sleep(0.01)
    return results


def hf_generate(model, prompts: list[list[int]], new_tokens: int) -> float:  # noqa: ANN001
    import torch

    width = max(len(p) for p in prompts)
    pad = 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, pad_token_id=pad, top_k=None, top_p=None,
                             temperature=None)
    elapsed = time.perf_counter() - start
    assert out.shape[1] == width + new_tokens
    return elapsed


def bench_hf_serial(model, vocab: int, prompt_len: int, output_len: int, repeats: int, seed: int) -> Result:  # noqa: ANN001
    prompts = make_prompts(repeats, prompt_len, vocab, seed)
    ttft = statistics.mean(hf_generate(model, [p], 1) for p in prompts)
    elapsed = sum(hf_generate(model, [p], output_len) for p in prompts)
    return Result("hf serial", 1, repeats * output_len / elapsed, ttft, (elapsed / repeats - ttft) / (output_len - 1))


def bench_hf_batched(model, vocab: int, streams: int, prompt_len: int, output_len: int, seed: int) -> Result:  # noqa: ANN001
    prompts = make_prompts(streams, prompt_len, vocab, seed)
    ttft = hf_generate(model, prompts, 1)
    elapsed = hf_generate(model, prompts, output_len)
    return Result("hf batched", streams, streams * output_len / elapsed, ttft, (elapsed - ttft) / (output_len - 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model name or checkpoint dir (default: the default model)")
    parser.add_argument("--smoke", action="store_true", help="the tiny test model, short prompts: a few seconds")
    parser.add_argument("--streams", default="1,8,32", help="comma-separated concurrency levels")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--num-threads", type=int, default=1, help="torch threads, both engines")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="both engines")
    parser.add_argument("--matmul-dtype", default=None, metavar="DTYPE[,DTYPE]",
                        help="the built-in engine's projection precision, float32 or bfloat16 (default: --dtype); "
                             "two, comma-separated: one built-in row each, side by side")
    parser.add_argument("--abort-trials", type=int, default=8, help="aborts timed per situation (0: skip)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=256)
    parser.add_argument("--hf-serial-requests", type=int, default=2, help="requests timed for the serial baseline")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--skip-hf-batched", action="store_true")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.num_threads)
    from builtin_engine.config import EngineConfig
    from builtin_engine.engine import LLMEngine
    from builtin_engine.model.store import DEFAULT_MODEL, resolve_model

    if args.smoke:
        from tests.fixtures_models import make_tiny_model

        model_dir = make_tiny_model(Path(tempfile.mkdtemp(prefix="bench-tiny-")) / "model")
        args.prompt_tokens, args.output_tokens = min(args.prompt_tokens, 32), min(args.output_tokens, 16)
        args.abort_trials = min(args.abort_trials, 2)
    else:
        model_dir = resolve_model(args.model or DEFAULT_MODEL)
    streams = [int(s) for s in args.streams.split(",")]
    matmul_dtypes = args.matmul_dtype.split(",") if args.matmul_dtype else [None]
    if args.matmul_dtype and not set(matmul_dtypes) <= {"float32", "bfloat16"}:
        parser.error(f"--matmul-dtype: float32 or bfloat16, got {args.matmul_dtype!r}")
    print(f"model {model_dir}\n{args.prompt_tokens} prompt tokens, {args.output_tokens} output tokens per stream, "
          f"greedy, ignore_eos; torch {torch.__version__}, {args.num_threads} thread(s), {args.dtype}"
          f"{f', builtin matmuls {args.matmul_dtype}' if args.matmul_dtype else ''}; "
          f"load average {_load()} at start\n", flush=True)

    kv_tokens = max(streams) * (args.prompt_tokens + args.output_tokens) + 256
    if args.abort_trials:
        kv_tokens = max(kv_tokens, max(streams) * (args.prompt_tokens + 64) + 5 * args.max_num_batched_tokens + 1024)
    ours: dict[str, dict[int, Result]] = {}  # per built-in row name, per number of streams
    aborts = None
    for matmul_dtype in matmul_dtypes:
        name = "builtin" if len(matmul_dtypes) == 1 else f"builtin {'bf16' if matmul_dtype == 'bfloat16' else 'f32'}mm"
        engine = LLMEngine.from_model_dir(model_dir, config=EngineConfig(
            dtype=args.dtype, matmul_dtype=matmul_dtype, max_num_seqs=max(streams) + 1,
            max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_tokens=kv_tokens))
        engine.start()
        bench_builtin(engine, 2, 16, 4, seed=99)  # warm-up
        ours[name] = {}
        for n in streams:
            ours[name][n] = bench_builtin(engine, n, args.prompt_tokens, args.output_tokens, seed=n, name=name)
            print(ours[name][n].row(), flush=True)
        if args.abort_trials and aborts is None:  # the first engine's only
            aborts = bench_abort_latency(engine, max(streams), args.prompt_tokens, args.abort_trials, seed=5)
        engine.shutdown()
    vocab = engine.model_config.vocab_size

    header = f"{'engine':<14} {'streams':>7} {'tok/s':>10} {'TTFT ms':>9} {'ITL ms':>8}"
    results = [result for rows in ours.values() for result in rows.values()]
    serial = None
    batched: dict[int, Result] = {}
    if not args.skip_hf:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype)).eval()
        hf_generate(model, make_prompts(1, 8, vocab, 0), 2)  # warm-up
        serial = bench_hf_serial(model, vocab, args.prompt_tokens, args.output_tokens, args.hf_serial_requests, 7)
        print(serial.row(), flush=True)
        results.append(serial)
        if not args.skip_hf_batched:
            for n in streams:
                if n > 1:
                    batched[n] = bench_hf_batched(model, vocab, n, args.prompt_tokens, args.output_tokens, n)
                    print(batched[n].row(), flush=True)
                    results.append(batched[n])

    print("\n" + header)
    for result in results:
        print(result.row())
    if serial is not None:
        for name, rows in ours.items():
            print(f"\nratio {name} / transformers (output tokens/s)")
            for n in streams:
                line = f"  {n:>3} streams: {rows[n].tokens_per_s / serial.tokens_per_s:5.2f}x vs one at a time"
                if n in batched:
                    line += f", {rows[n].tokens_per_s / batched[n].tokens_per_s:5.2f}x vs batched"
                print(line)
    if aborts is not None:
        print(f"\nabort latency, abort() to blocks freed, {args.abort_trials} trials each (ms): median / max")
        for kind, values in aborts.items():
            where = (f"a decoding stream among {max(streams)}" if kind == "decode" else
                     f"a {min(4 * args.max_num_batched_tokens, engine.max_model_len - 16)}-token prompt in chunked "
                     f"prefill beside {max(streams) - 1} decoding")
            print(f"  {where}: {statistics.median(values) * 1e3:.0f} / {max(values) * 1e3:.0f}")
    print(f"\nload average {_load()} at the end")
    return 0


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    raise SystemExit(main())
