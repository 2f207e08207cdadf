"""The built-in engine on a GPU, checked in under 5 minutes on a lent GPU machine:

    python bench/gpu_check.py [--model DIR] [--out bench/results/gpu_check.json]
    python bench/gpu_check.py --smoke      # the same code on the CPU, tiny model, toy sizes

1. Kernels: every Triton kernel against its torch reference on CUDA, and decode attention's
   achieved bandwidth as a fraction of a device copy (batch 64 x 4096 context; target >= 70%):
   `bench/kernels_gpu.py --no-sweep`, run as a subprocess, its JSON read back.
2. Tokens: the engine's greedy tokens on CUDA in bfloat16 (CUDA graphs on) against the CPU
   float32 engine's (token-exact against transformers) on a fixed prompt set: the first
   divergence per prompt. bfloat16 may diverge late, not early: one before `--early` (4) fails.
3. Throughput: output tokens/s at 1/16/64 streams (`--prompt-tokens` + `--output-tokens` each,
   greedy, ignore_eos), with and without CUDA graphs; and transformers' `generate`, batched, at the
   largest stream count on the same device and model (target: the engine >= 5x it at 64 streams).

A part that fails (an exception) is recorded in the JSON's `errors` and the rest still runs.

Needs only torch, triton and safetensors (what the GPU image has; `pip install safetensors` if
not): the engine is imported without the gateway, prompts are token ids (no tokenizer), and the
model is `--model` (any Llama-family safetensors checkpoint; default: the converted default model
when this machine has it, else the tiny random test model, which needs `tokenizers`). --smoke runs
everything on the CPU (kernels in Triton's interpreter, the fast path's torch.compile'd decode
step for the "graphs" arm): timings meaningless, it proves the script. Prints a table, writes
JSON, exits 1 when a kernel check fails or a prompt diverges early.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from builtin_engine.config import EngineConfig  # noqa: E402
from builtin_engine.engine import LLMEngine  # noqa: E402
from builtin_engine.scheduling.sampling_params import SamplingParams  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "results" / "gpu_check.json"
NUM_PROMPTS = 8


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny model, toy sizes")
    parser.add_argument("--model", type=Path, default=None, help="checkpoint directory")
    parser.add_argument("--out", type=Path, default=None, help=f"JSON path (default {DEFAULT_OUT}; none in smoke)")
    parser.add_argument("--streams", type=int, nargs="+", default=None, help="default 1 16 64 (smoke 1 2 4)")
    parser.add_argument("--prompt-tokens", type=int, default=None, help="default 128 (smoke 12)")
    parser.add_argument("--output-tokens", type=int, default=None, help="default 128 (smoke 6)")
    parser.add_argument("--parity-tokens", type=int, default=None, help="greedy tokens compared; default 32 (smoke 8)")
    parser.add_argument("--early", type=int, default=None,
                        help="a divergence before this position fails; default 4 (smoke 0: the tiny random model's "
                             "near-tied logits let bfloat16 diverge anywhere)")
    parser.add_argument("--kernels-json", type=Path, default=None,
                        help="read an earlier `bench/kernels_gpu.py --out` JSON instead of running it")
    parser.add_argument("--hf", action=argparse.BooleanOptionalAction, default=True,
                        help="time transformers' batched generate at the largest stream count (default on)")
    args = parser.parse_args(argv)
    smoke = args.smoke
    args.streams = args.streams or ([1, 2, 4] if smoke else [1, 16, 64])
    args.prompt_tokens = args.prompt_tokens or (12 if smoke else 128)
    args.output_tokens = args.output_tokens or (6 if smoke else 128)
    args.parity_tokens = args.parity_tokens or (8 if smoke else 32)
    args.early = (0 if smoke else 4) if args.early is None else args.early
    return args


def pick_model(args: argparse.Namespace) -> Path:
    if args.model is not None:
        return args.model
    if not args.smoke:
        from builtin_engine.model.store import DEFAULT_MODEL, is_fetched, model_dir

        if is_fetched(DEFAULT_MODEL):
            return model_dir(DEFAULT_MODEL)
    from tests.fixtures_models import cached_tiny_model  # needs tokenizers (and pytest)

    return cached_tiny_model()


def kernel_check(smoke: bool, earlier: Path | None) -> dict[str, Any]:
    """bench/kernels_gpu.py --no-sweep (or its earlier JSON): correctness rows, copy bandwidth,
    decode attention's share."""
    if earlier is not None:
        report = json.loads(earlier.read_text())
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "kernels.json"
            cmd = [sys.executable, str(ROOT / "bench" / "kernels_gpu.py"), "--no-sweep", "--out", str(out)]
            done = subprocess.run(cmd + (["--smoke"] if smoke else []), cwd=ROOT, capture_output=True, text=True)
            if not out.exists():
                return {"ok": False, "error": (done.stdout + done.stderr)[-3000:]}
            report = json.loads(out.read_text())
    target = next(name for name in report["targets"] if name.startswith("decode"))  # "decode B64 ctx4096 >= ..."
    shape = target.split(" >=")[0]
    decode = next(r for r in report["timings"] if r["name"].startswith(shape))
    failed = [c["name"] for c in report["correctness"] if not c["ok"]]
    return {"ok": not failed, "checks": len(report["correctness"]), "failed": failed,
            "copy_GBps": report["copy_GBps"], "decode_shape": shape,
            "decode_fraction_of_copy": decode.get("fraction_of_copy"), "targets": report["targets"]}


def make_engine(model: Path, device: str, dtype: str, compile: bool, max_num_seqs: int,
                max_model_len: int) -> LLMEngine:
    config = EngineConfig(device=device, dtype=dtype, compile=compile, max_num_seqs=max_num_seqs,
                          max_model_len=max_model_len, kv_cache_tokens=max_num_seqs * max_model_len,
                          max_waiting=1024)
    return LLMEngine.from_model_dir(model, config=config)


def generate(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float]:
    """Greedy tokens of every prompt, run as one batch, and the seconds it took."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    started = time.perf_counter()
    handles = [engine.add_request(prompt, params) for prompt in prompts]
    while engine.has_work():
        engine.step()
    took = time.perf_counter() - started
    tokens = []
    for handle in handles:
        ids: list[int] = []
        while not handle.finished:
            for choice in handle.get(timeout=60).choices:
                ids.extend(choice.token_ids)
        tokens.append(ids)
    return tokens, took


def hf_generate(model: Path, device: str, prompts: list[list[int]], output_tokens: int) -> dict[str, Any]:
    """transformers' greedy `generate` over all `prompts` as one batch (equal lengths: no padding),
    bfloat16 on `device`: output tokens/s."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).to(device).eval()
    batch = torch.tensor(prompts, device=device)

    def run(ids: torch.Tensor, new: int) -> torch.Tensor:
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                              min_new_tokens=new, pad_token_id=0)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return out

    run(batch[:1], 2)
    started = time.perf_counter()
    out = run(batch, output_tokens)
    took = time.perf_counter() - started
    generated = (out.shape[1] - batch.shape[1]) * batch.shape[0]
    return {"streams": len(prompts), "tokens_per_s": generated / took, "seconds": took}


def make_prompts(vocab: int, count: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(length)] for _ in range(count)]


def first_divergence(ours: list[int], reference: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(ours, reference)) if a != b), len(reference))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("gpu_check.py: torch sees no CUDA device; run it on a GPU machine, or --smoke here", file=sys.stderr)
        return 2
    started = time.perf_counter()
    device, dtype = ("cpu", "bfloat16") if args.smoke else ("cuda", "bfloat16")
    where = "cpu (smoke run)" if args.smoke else torch.cuda.get_device_name()
    model = pick_model(args)
    print(f"machine: {where}; torch {torch.__version__}; model {model}")
    result: dict[str, Any] = {"device": where, "smoke": args.smoke, "torch": torch.__version__, "model": str(model)}

    errors: list[str] = []

    def failed(part: str) -> None:
        errors.append(f"{part}: {traceback.format_exc()[-2000:]}")
        print(f"{part} FAILED:\n{errors[-1]}", flush=True)

    result["kernels"] = kernels = kernel_check(args.smoke, args.kernels_json)
    print(f"kernels: {kernels.get('checks', 0) - len(kernels.get('failed', []))}/{kernels.get('checks', 0)} checks "
          f"pass; {kernels.get('decode_shape')} at {kernels.get('decode_fraction_of_copy')} of copy bandwidth"
          + (f"\n{kernels['error']}" if "error" in kernels else ""), flush=True)

    max_streams = max(max(args.streams), NUM_PROMPTS)
    max_model_len = args.prompt_tokens + max(args.output_tokens, args.parity_tokens) + 1
    reference = make_engine(model, "cpu", "float32", False, NUM_PROMPTS, max_model_len)
    vocab = reference.model_config.vocab_size
    prompts = make_prompts(vocab, NUM_PROMPTS, args.prompt_tokens, seed=1)
    expected, _ = generate(reference, prompts, args.parity_tokens)
    del reference
    print(f"reference tokens (cpu float32) at {time.perf_counter() - started:.0f} s", flush=True)

    rows, firsts = [], []
    for graphs in (True, False):
        try:
            engine = make_engine(model, device, dtype, graphs, max_streams, max_model_len)
            print(f"engine: {engine.placement.describe()} at {time.perf_counter() - started:.0f} s", flush=True)
            if graphs:
                got, _ = generate(engine, prompts, args.parity_tokens)
                firsts = [first_divergence(ours, ref) for ours, ref in zip(got, expected)]
                print(f"tokens ({device} {dtype} vs cpu float32, {args.parity_tokens} greedy): first divergence "
                      f"per prompt {firsts}", flush=True)
            for streams in args.streams:
                stream_prompts = make_prompts(vocab, streams, args.prompt_tokens, seed=100 + streams)
                generate(engine, stream_prompts[:1], 2)  # the first request's one-off costs out of the timing
                graph_steps = engine.runner.num_graph_steps
                _, took = generate(engine, stream_prompts, args.output_tokens)
                rows.append({"streams": streams, "graphs": graphs, "tokens_per_s": streams * args.output_tokens / took,
                             "seconds": took, "graph_steps": engine.runner.num_graph_steps - graph_steps})
                print(f"  {streams:>3} streams, graphs {'on ' if graphs else 'off'}: "
                      f"{rows[-1]['tokens_per_s']:9.1f} output tokens/s ({rows[-1]['graph_steps']} graph steps)",
                      flush=True)
            del engine
        except Exception:
            failed(f"engine (graphs {'on' if graphs else 'off'})")
        if device == "cuda":
            torch.cuda.empty_cache()
    if args.hf:
        streams = max(args.streams)
        try:
            hf = hf_generate(model, device, make_prompts(vocab, streams, args.prompt_tokens, seed=100 + streams),
                             args.output_tokens)
            best = max((r["tokens_per_s"] for r in rows if r["streams"] == streams), default=float("nan"))
            hf["engine_ratio"] = best / hf["tokens_per_s"]
            result["hf_generate"] = hf
            print(f"transformers generate, {streams} streams batched: {hf['tokens_per_s']:.1f} output tokens/s; "
                  f"engine {hf['engine_ratio']:.2f}x", flush=True)
        except Exception:
            failed("transformers generate")
    result.update(first_divergence=firsts, throughput=rows, errors=errors, elapsed_s=time.perf_counter() - started)
    early = [i for i in firsts if i < min(args.early, args.parity_tokens)]
    result["ok"] = kernels["ok"] and not early and not errors and bool(firsts)
    out = args.out if args.out is not None else (None if args.smoke else DEFAULT_OUT)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")
    print(f"{'ok' if result['ok'] else 'FAILED'}; elapsed {result['elapsed_s']:.0f} s")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
