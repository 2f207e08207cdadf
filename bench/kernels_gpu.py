"""GPU check for kernels/: correctness against the torch references on CUDA, then timings.

    python bench/kernels_gpu.py [--out bench/results/kernels_gpu.json] [--no-sweep]

1. Correctness: every Triton wrapper against its torch reference on the GPU (float32 and
   bfloat16, edge lengths, GQA, shuffled block tables), and the sampler's picks token for token.
2. Bandwidth: a device copy of 1 GiB sets the yardstick; decode attention (Llama-8B-like: 32 query
   heads, 8 kv heads, head dim 128, block size 16, bf16) at batch 1/16/64 x context 512/4096,
   rms_norm / fused_add_rms_norm / silu_and_mul at hidden 4096 x 8192 tokens are timed with
   triton.testing.do_bench and reported as achieved GB/s and as a fraction of the copy's.
   Prefill attention and the sampler are timed for information.
3. A small sweep of decode tile sizes / warps / stages at batch 64 x 4096 and batch 1 x 4096
   (skipped with --no-sweep, or when the time budget is spent), to pick the wrapper's defaults.

Targets: decode at batch 64 x 4096 >= 70% of copy bandwidth; rms_norm and silu_and_mul >= 80%.
Prints a table, writes JSON, exits 1 if any correctness check fails. Runs in well under
5 minutes on an H100 or H200. Without a CUDA device it exits at once and says so.
--smoke runs the same code on the CPU in Triton's interpreter at toy sizes (timings meaningless),
to check the script itself on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "kernels_gpu.json"
TIME_BUDGET_S = 240.0  # the sweep stops starting new configs past this


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help=f"JSON path (default {DEFAULT_OUT})")
    parser.add_argument("--no-sweep", action="store_true", help="skip the decode tuning sweep")
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter, toy sizes")
    return parser.parse_args()


ARGS = _parse_args()
if ARGS.smoke:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402

if not ARGS.smoke and not torch.cuda.is_available():
    sys.exit(
        "kernels_gpu.py: no CUDA device found (torch.cuda.is_available() is False); "
        "this check needs an NVIDIA GPU. Use --smoke to exercise the script on the CPU."
    )

sys.path.insert(0, str(ROOT))

import triton  # noqa: E402

from kernels import make_cos_sin_cache  # noqa: E402
from kernels.activation import silu_and_mul_reference, silu_and_mul_triton  # noqa: E402
from kernels.decode_attention import (  # noqa: E402
    choose_num_splits,
    paged_attention_decode_reference,
    paged_attention_decode_triton,
)
from kernels.kv_cache import reshape_and_cache_reference, reshape_and_cache_triton  # noqa: E402
from kernels.norm import (  # noqa: E402
    fused_add_rms_norm_reference,
    fused_add_rms_norm_triton,
    rms_norm_reference,
    rms_norm_triton,
)
from kernels.prefill_attention import (  # noqa: E402
    paged_attention_prefill_reference,
    paged_attention_prefill_triton,
)
from kernels.rope import rotary_reference, rotary_triton  # noqa: E402
from kernels.sampling import sample_reference, sample_triton  # noqa: E402

DEVICE = torch.device("cpu" if ARGS.smoke else "cuda")
BF16, FP32 = torch.bfloat16, torch.float32
# (rtol, atol): bfloat16 results may differ by an ulp at each rounding point (norm and rotary round
# twice, as transformers does; Triton's interpreter truncates); a rotary output is a difference of
# rounded products that may cancel on one side only; attention also rounds the softmax weights to
# bfloat16 for the PV product.
TOL = {
    ("elementwise", FP32): (1e-5, 1e-5),
    ("elementwise", BF16): (3.2e-2, 1e-5),
    ("cancelling", FP32): (1e-5, 1e-5),
    ("cancelling", BF16): (3.2e-2, 3.2e-2),
    ("attention", FP32): (1e-4, 1e-5),
    ("attention", BF16): (2e-2, 2e-2),
}
START = time.perf_counter()

# Sizes: the real ones, or toys for --smoke.
if ARGS.smoke:
    HQ, HKV, HEAD_DIM, BLOCK = 4, 2, 32, 16
    DECODE_GRID = [(1, 32), (2, 64)]
    DECODE_TARGET = (2, 64)
    NORM_TOKENS, HIDDEN, INTERMEDIATE = 16, 64, 128
    COPY_BYTES = 1 << 20
    SAMPLE_SHAPE = (2, 300)
    PREFILL_CASES = [[32]]
    SWEEP = [dict(tile_n=32, num_warps=4, num_stages=2)]
else:
    HQ, HKV, HEAD_DIM, BLOCK = 32, 8, 128, 16
    DECODE_GRID = [(b, n) for b in (1, 16, 64) for n in (512, 4096)]
    DECODE_TARGET = (64, 4096)
    NORM_TOKENS, HIDDEN, INTERMEDIATE = 8192, 4096, 4096
    COPY_BYTES = 1 << 30
    SAMPLE_SHAPE = (64, 128256)
    PREFILL_CASES = [[2048], [512] * 4]
    SWEEP = [
        dict(tile_n=t, num_warps=w, num_stages=s)
        for t in (32, 64, 128)
        for w in (4, 8)
        for s in (2, 3)
    ]


def bench_ms(fn: Callable[[], Any]) -> float:
    """Median milliseconds per call: triton.testing.do_bench on the GPU, a plain timer in smoke."""
    if ARGS.smoke:
        fn()
        t0 = time.perf_counter()
        for _ in range(2):
            fn()
        return (time.perf_counter() - t0) / 2 * 1e3
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def generator(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def randn(*shape: int, dtype: torch.dtype = FP32, g: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g, device=DEVICE) * scale).to(dtype)


def paged_kv(seq_lens: list[int], dtype: torch.dtype, g: torch.Generator, head_dim: int = HEAD_DIM,
             num_kv_heads: int = HKV, block_size: int = BLOCK):
    """Random caches and shuffled block tables (padding entries point past the cache)."""
    needed = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(needed) + 1
    perm = torch.randperm(num_blocks, generator=g, device=DEVICE).to(torch.int32)
    tables = torch.full((len(seq_lens), max(needed)), num_blocks + 7, dtype=torch.int32, device=DEVICE)
    start = 0
    for b, n in enumerate(needed):
        tables[b, :n] = perm[start : start + n]
        start += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return randn(*shape, dtype=dtype, g=g), randn(*shape, dtype=dtype, g=g), tables


# ---------------------------------------------------------------------------- correctness

CHECKS: list[dict[str, Any]] = []


def check(name: str, out: torch.Tensor, ref: torch.Tensor, kind: str = "elementwise") -> None:
    rtol, atol = TOL[(kind, ref.dtype)] if ref.is_floating_point() else (0.0, 0.0)
    diff = (out.double() - ref.double()).abs()
    bound = atol + rtol * ref.double().abs()
    ok = out.shape == ref.shape and out.dtype == ref.dtype and bool((diff <= bound).all())
    CHECKS.append(dict(name=name, ok=ok, max_abs_err=float(diff.max()) if diff.numel() else 0.0,
                       rtol=rtol, atol=atol))


def correctness() -> None:
    g = generator(0)
    lens = [1, BLOCK - 1, BLOCK, BLOCK + 1, 300] + ([] if ARGS.smoke else [1000, 4096])
    for dtype in (FP32, BF16):
        tag = str(dtype).removeprefix("torch.")
        tokens = 37
        x = randn(tokens, HIDDEN, dtype=dtype, g=g, scale=3)
        res = randn(tokens, HIDDEN, dtype=dtype, g=g)
        w = randn(HIDDEN, dtype=dtype, g=g, scale=0.1) + 1
        check(f"rms_norm {tag}", rms_norm_triton(x, w, 1e-5), rms_norm_reference(x, w, 1e-5))
        out, r = fused_add_rms_norm_triton(x, res, w, 1e-5)
        ref_out, ref_r = fused_add_rms_norm_reference(x, res, w, 1e-5)
        check(f"fused_add_rms_norm residual {tag}", r, ref_r)
        check(f"fused_add_rms_norm out {tag}", out, ref_out)
        xm = randn(tokens, 2 * (INTERMEDIATE + 44), dtype=dtype, g=g, scale=4)  # not a power of 2
        check(f"silu_and_mul {tag}", silu_and_mul_triton(xm), silu_and_mul_reference(xm))

        qkv = randn(tokens, (HQ + 2 * HKV) * HEAD_DIM, dtype=dtype, g=g)
        q = qkv[:, : HQ * HEAD_DIM].view(tokens, HQ, HEAD_DIM)
        k = qkv[:, HQ * HEAD_DIM : (HQ + HKV) * HEAD_DIM].view(tokens, HKV, HEAD_DIM)
        positions = torch.randint(0, 8192, (tokens,), generator=g, device=DEVICE)
        table = make_cos_sin_cache(8192, HEAD_DIM, 500000.0, device=DEVICE)
        q_ref, k_ref = q.clone(), k.clone()
        rotary_reference(q_ref, k_ref, positions, table)
        rotary_triton(q, k, positions, table)
        check(f"rotary q {tag}", q, q_ref, "cancelling")
        check(f"rotary k {tag}", k, k_ref, "cancelling")

        k_cache, v_cache, _ = paged_kv([tokens * 2], dtype, g)
        slots = torch.randperm(k_cache.shape[0] * BLOCK, generator=g, device=DEVICE)[:tokens]
        kc_ref, vc_ref = k_cache.clone(), v_cache.clone()
        reshape_and_cache_reference(k, k, kc_ref, vc_ref, slots)
        reshape_and_cache_triton(k, k, k_cache, v_cache, slots)
        check(f"reshape_and_cache {tag}", k_cache, kc_ref)

        for head_dim, hq, hkv in ((HEAD_DIM, HQ, HKV), (64, 8, 8)):
            k_cache, v_cache, tables = paged_kv(lens, dtype, g, head_dim=head_dim, num_kv_heads=hkv)
            seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
            qd = randn(len(lens), hq, head_dim, dtype=dtype, g=g)
            args = (qd, k_cache, v_cache, tables, seq_lens, head_dim**-0.5)
            ref = paged_attention_decode_reference(*args)
            for splits in (None, 1, 4):
                check(f"decode D{head_dim} Hq{hq}/Hkv{hkv} splits={splits} {tag}",
                      paged_attention_decode_triton(*args, num_splits=splits), ref, "attention")

            chunks = [(1, 1), (17, 17), (300, 300), (40, 8), (1000, 64), (2048, 1)]
            if ARGS.smoke:
                chunks = chunks[:4]
            k_cache, v_cache, tables = paged_kv([s for s, _ in chunks], dtype, g, head_dim=head_dim,
                                                num_kv_heads=hkv)
            q_lens = [n for _, n in chunks]
            cu = torch.tensor([0] + q_lens, device=DEVICE).cumsum(0).to(torch.int32)
            seq_lens = torch.tensor([s for s, _ in chunks], dtype=torch.int32, device=DEVICE)
            qp = randn(sum(q_lens), hq, head_dim, dtype=dtype, g=g)
            args = (qp, k_cache, v_cache, tables, cu, seq_lens, head_dim**-0.5)
            check(f"prefill D{head_dim} Hq{hq}/Hkv{hkv} {tag}", paged_attention_prefill_triton(*args),
                  paged_attention_prefill_reference(*args), "attention")

    batch, vocab = (16, 128256) if not ARGS.smoke else (4, 300)
    logits = randn(batch, vocab, g=g, scale=4)
    knobs = [
        torch.tensor(v, device=DEVICE, dtype=dt)[:batch]
        for v, dt in (
            ([1.0, 0.7, 1.2, 0.0] * 4, FP32),
            ([0, 50, 0, 5] * 4, torch.int32),
            ([1.0, 0.9, 0.95, 1.0] * 4, FP32),
            ([0.0, 0.0, 0.05, 0.0] * 4, FP32),
        )
    ]
    seeds = torch.arange(batch, device=DEVICE) * 7919
    offsets = torch.arange(batch, device=DEVICE) + 3
    check("sample picks", sample_triton(logits, *knobs, seeds, offsets),
          sample_reference(logits, *knobs, seeds, offsets))


# ---------------------------------------------------------------------------- timings

TIMINGS: list[dict[str, Any]] = []


def timed(name: str, fn: Callable[[], Any], bytes_moved: float | None, copy_gbps: float | None,
          extra: dict[str, Any] | None = None) -> dict[str, Any]:
    ms = bench_ms(fn)
    row: dict[str, Any] = dict(name=name, ms=ms)
    if bytes_moved is not None:
        row["GBps"] = bytes_moved / (ms * 1e-3) / 1e9
        if copy_gbps:
            row["fraction_of_copy"] = row["GBps"] / copy_gbps
    row.update(extra or {})
    TIMINGS.append(row)
    return row


def copy_bandwidth() -> float:
    x = torch.empty(COPY_BYTES // 2, dtype=BF16, device=DEVICE).normal_()
    ms = bench_ms(lambda: torch.empty_like(x).copy_(x))
    gbps = 2 * COPY_BYTES / (ms * 1e-3) / 1e9
    TIMINGS.append(dict(name=f"device copy {COPY_BYTES >> 20} MiB", ms=ms, GBps=gbps, fraction_of_copy=1.0))
    return gbps


def decode_inputs(batch: int, context: int, g: torch.Generator):
    k_cache, v_cache, tables = paged_kv([context] * batch, BF16, g)
    q = randn(batch, HQ, HEAD_DIM, dtype=BF16, g=g)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=DEVICE)
    kv_bytes = 2 * batch * context * HKV * HEAD_DIM * 2
    io_bytes = kv_bytes + 2 * q.numel() * 2 + tables.numel() * 4
    return (q, k_cache, v_cache, tables, seq_lens, HEAD_DIM**-0.5), io_bytes


def timings(copy_gbps: float) -> None:
    g = generator(1)
    for batch, context in DECODE_GRID:
        args, io_bytes = decode_inputs(batch, context, g)
        splits = choose_num_splits(batch, HKV, args[3].shape[1] * BLOCK, DEVICE)
        timed(f"decode B{batch} ctx{context}", lambda: paged_attention_decode_triton(*args), io_bytes,
              copy_gbps, dict(num_splits=splits))
        del args

    x = randn(NORM_TOKENS, HIDDEN, dtype=BF16, g=g)
    res = randn(NORM_TOKENS, HIDDEN, dtype=BF16, g=g)
    w = randn(HIDDEN, dtype=BF16, g=g)
    size = x.numel() * 2
    timed(f"rms_norm {NORM_TOKENS}x{HIDDEN}", lambda: rms_norm_triton(x, w, 1e-5), 2 * size, copy_gbps)
    timed(f"rms_norm torch reference", lambda: rms_norm_reference(x, w, 1e-5), 2 * size, copy_gbps)
    timed(f"fused_add_rms_norm {NORM_TOKENS}x{HIDDEN}", lambda: fused_add_rms_norm_triton(x, res, w, 1e-5),
          4 * size, copy_gbps)
    xm = randn(NORM_TOKENS, 2 * INTERMEDIATE, dtype=BF16, g=g)
    silu_bytes = xm.numel() * 2 * 3 / 2
    timed(f"silu_and_mul {NORM_TOKENS}x{2 * INTERMEDIATE}", lambda: silu_and_mul_triton(xm), silu_bytes,
          copy_gbps)
    timed("silu_and_mul torch reference", lambda: silu_and_mul_reference(xm), silu_bytes, copy_gbps)
    del x, res, xm

    for q_lens in PREFILL_CASES:
        k_cache, v_cache, tables = paged_kv(q_lens, BF16, g)
        cu = torch.tensor([0] + q_lens, device=DEVICE).cumsum(0).to(torch.int32)
        seq_lens = torch.tensor(q_lens, dtype=torch.int32, device=DEVICE)
        q = randn(sum(q_lens), HQ, HEAD_DIM, dtype=BF16, g=g)
        args = (q, k_cache, v_cache, tables, cu, seq_lens, HEAD_DIM**-0.5)
        flops = sum(4 * n * n / 2 * HQ * HEAD_DIM for n in q_lens)  # causal QK and PV
        row = timed(f"prefill {len(q_lens)}x{q_lens[0]} tokens",
                    lambda: paged_attention_prefill_triton(*args), None, None)
        row["TFLOPs"] = flops / (row["ms"] * 1e-3) / 1e12

    batch, vocab = SAMPLE_SHAPE
    logits = randn(batch, vocab, g=g, scale=4)
    ones, zeros = torch.ones(batch, device=DEVICE), torch.zeros(batch, device=DEVICE)
    no_k = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    ids = torch.arange(batch, device=DEVICE)
    timed(f"sample B{batch} V{vocab} temperature only",
          lambda: sample_triton(logits, ones, no_k, ones, zeros, ids, ids), None, None)
    timed(f"sample B{batch} V{vocab} top_k 50 top_p 0.9",
          lambda: sample_triton(logits, ones, no_k + 50, ones * 0.9, zeros, ids, ids), None, None)


def sweep(copy_gbps: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    g = generator(2)
    for batch, context in (DECODE_TARGET, (1, DECODE_TARGET[1])):
        args, io_bytes = decode_inputs(batch, context, g)
        for config in SWEEP:
            if time.perf_counter() - START > TIME_BUDGET_S:
                print(f"sweep stopped: time budget of {TIME_BUDGET_S:.0f} s spent")
                return rows
            ms = bench_ms(lambda: paged_attention_decode_triton(*args, **config))
            gbps = io_bytes / (ms * 1e-3) / 1e9
            rows.append(dict(batch=batch, context=context, **config, ms=ms, GBps=gbps,
                             fraction_of_copy=gbps / copy_gbps))
        del args
    return rows


# ---------------------------------------------------------------------------- report

def main() -> int:
    device_name = "cpu (interpreter smoke run)" if ARGS.smoke else torch.cuda.get_device_name()
    print(f"device: {device_name}; torch {torch.__version__}; triton {triton.__version__}")
    try:
        correctness()
    except Exception as exc:  # a kernel that cannot even run: say which, and still time the rest
        CHECKS.append(dict(name=f"correctness stopped: {type(exc).__name__}: {exc}"[:300], ok=False,
                           max_abs_err=float("nan"), rtol=0.0, atol=0.0))
    failed = [c for c in CHECKS if not c["ok"]]
    print(f"\ncorrectness: {len(CHECKS) - len(failed)}/{len(CHECKS)} checks pass")
    for c in CHECKS:
        mark = "ok  " if c["ok"] else "FAIL"
        print(f"  {mark} {c['name']:<44} max |err| {c['max_abs_err']:.3g} "
              f"(rtol {c['rtol']}, atol {c['atol']})")

    copy_gbps = copy_bandwidth()
    timings(copy_gbps)
    print(f"\n{'kernel':<44} {'ms':>9} {'GB/s':>8} {'of copy':>8}  other")
    for row in TIMINGS:
        gbps = f"{row['GBps']:8.0f}" if "GBps" in row else " " * 8
        frac = f"{row['fraction_of_copy']:8.0%}" if "fraction_of_copy" in row else " " * 8
        other = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in row.items() if k not in ("name", "ms", "GBps", "fraction_of_copy"))
        print(f"{row['name']:<44} {row['ms']:9.4f} {gbps} {frac}  {other}")

    def fraction(name: str) -> float:
        return next(r["fraction_of_copy"] for r in TIMINGS if r["name"].startswith(name))

    b, n = DECODE_TARGET
    targets = {
        f"decode B{b} ctx{n} >= 70% of copy": fraction(f"decode B{b} ctx{n}") >= 0.70,
        "rms_norm >= 80% of copy": fraction(f"rms_norm {NORM_TOKENS}") >= 0.80,
        "silu_and_mul >= 80% of copy": fraction(f"silu_and_mul {NORM_TOKENS}") >= 0.80,
    }
    print("\ntargets:")
    for name, met in targets.items():
        print(f"  {'met ' if met else 'MISS'} {name}")

    sweep_rows = [] if ARGS.no_sweep else sweep(copy_gbps)
    if sweep_rows:
        print(f"\ndecode sweep ({len(sweep_rows)} configs):")
        for batch in sorted({r["batch"] for r in sweep_rows}, reverse=True):
            rows = sorted((r for r in sweep_rows if r["batch"] == batch), key=lambda r: r["ms"])
            for r in rows[:3]:
                print(f"  B{batch} ctx{r['context']} tile_n={r['tile_n']} warps={r['num_warps']} "
                      f"stages={r['num_stages']}: {r['ms']:.4f} ms, {r['fraction_of_copy']:.0%} of copy")

    elapsed = time.perf_counter() - START
    result = dict(device=device_name, torch=torch.__version__, triton=triton.__version__,
                  smoke=ARGS.smoke, copy_GBps=copy_gbps, correctness=CHECKS, timings=TIMINGS,
                  targets=targets, sweep=sweep_rows, elapsed_s=elapsed)
    out = ARGS.out if ARGS.out is not None else (None if ARGS.smoke else DEFAULT_OUT)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {out}")
    print(f"elapsed {elapsed:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
