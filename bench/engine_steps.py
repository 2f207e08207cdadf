"""The built-in engine stepped by hand, in process: the time for N prompts of random token ids to
prefill and decode a fixed number of greedy tokens, optionally with CPU-bound processes beside it.

What it isolates: the engine's own step loop (no asyncio, no server, no step thread), so a
difference between this and `engines_compare.py`'s server figures is the server path's, and a
difference with `--busy 1` is how the engine copes with a core it does not have to itself (the
OpenMP spin-wait finding in bench/README.md, issue 16).

    .venv/bin/python bench/engine_steps.py --dtype bfloat16              # compiled fast path
    .venv/bin/python bench/engine_steps.py --dtype bfloat16 --eager
    .venv/bin/python bench/engine_steps.py --dtype float32 --compile     # float32, compiled
    .venv/bin/python bench/engine_steps.py --dtype float32 --busy 1      # one `while True` beside it
    GOMP_SPINCOUNT=300000 .venv/bin/python bench/engine_steps.py --busy 1   # libgomp's own default
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import time

import builtin_engine  # noqa: F401 - caps OpenMP's spin-wait before torch loads, as the gateway does
from builtin_engine.config import EngineConfig
from builtin_engine.engine import LLMEngine
from builtin_engine.model.store import DEFAULT_MODEL, resolve_model
from builtin_engine.scheduling.sampling_params import SamplingParams


def _spin() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    parser.add_argument("--eager", action="store_true", help="no torch.compile (the bfloat16 path compiles by default)")
    parser.add_argument("--compile", action="store_true", help="torch.compile float32 too (eager by default)")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-batched-tokens", type=int, default=None,
                        help="tokens per engine step (the prefill budget); default: the engine's (256 on the CPU)")
    parser.add_argument("--busy", type=int, default=0, help="CPU-bound processes running beside the engine")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    args = parser.parse_args()

    config = EngineConfig(dtype=args.dtype, compile=not args.eager and (args.compile or args.dtype == "bfloat16"),
                          num_threads=args.threads, max_num_seqs=args.streams,
                          max_num_batched_tokens=args.max_batched_tokens)
    engine = LLMEngine.from_model_dir(str(resolve_model(args.model)), config=config)
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_tokens, ignore_eos=True)
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for hog in hogs:
        hog.start()
    try:
        for _ in range(args.streams):
            engine.add_request([rng.randrange(10, 30000) for _ in range(args.prompt_tokens)], params)
        start, steps = time.perf_counter(), 0
        while engine.has_work():
            engine.step()
            steps += 1
        elapsed = time.perf_counter() - start
    finally:
        for hog in hogs:
            hog.terminate()
    print(f"{args.dtype}{' compiled' if config.compile else ' eager'}: {args.streams} x ({args.prompt_tokens} + {args.output_tokens}) "
          f"tokens in {elapsed:.2f} s ({args.streams * args.output_tokens / elapsed:.1f} output tok/s), {steps} steps, "
          f"{engine.scheduler.max_num_batched_tokens} tokens a step, {args.busy} busy beside it, GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}, cpu {os.cpu_count()}")


if __name__ == "__main__":
    main()
