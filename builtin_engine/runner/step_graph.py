"""A whole CPU step — prefill chunks and decode rows together — as one torch.compile'd graph.

The decode graph (`builtin_engine.runner.decode_graph`) serves steps that are all one-token decodes; a
step with a prefill chunk in it ran eagerly, and its norms, rotary, SiLU and casts, a few dozen
small ops a layer, cost about a fifth of such a step. This graph takes any step but a pooling
one: every chunk, decode rows included, is a run of the paged prefill attention (which computes
a one-token run exactly as the decode kernel does), so the graph's only varying sizes are the
token count T, the sequence count B and the count S of rows that sample. Those three are
dynamic dimensions of one graph (sizes 2 and up, a smaller step padded; bounds fixed, not drawn
from the config), not a set of buckets: it is compiled once, before the engine is ready, run
once at the configured budget's largest sizes, and cached on disk
(`builtin_engine.runner.compile_cache`). All-decode steps run through it as fast as through the decode
graph, so on the CPU only this one is compiled. Padding tokens write the KV cache's pad block
and belong to no sequence; padding sequences have no tokens.

Only on the CPU, and only with the C++ kernels built (the torch reference of the prefill
attention reads lengths on the host, which a graph cannot). Aborts apply before the step, not
between its layers, as with the decode graph; pooling steps (embeddings) stay eager.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
import torch._inductor.config
import torch.fx.experimental._config

from builtin_engine.config import EngineConfig
from builtin_engine.model.llama import KVCache, LlamaModel
from builtin_engine.scheduling.scheduler import ScheduledChunk

_log = logging.getLogger(__name__)

MIN_SIZE = 2  # torch specializes dynamic sizes 0 and 1: smaller steps are padded to this
MAX_SIZE = 1 << 16  # tokens (and sequences) of a step; far above any budget, int32 indexing still
# Inductor runs a loop on one thread when each thread would get fewer elements than this at the
# graph's size hint (MIN_SIZE tokens, the first compile's): the norms and SiLU (576-3,072 a token)
# stay serial, the logits' float32 copy (the vocabulary a row) parallel. A parallel region wakes
# the second OpenMP thread, which has slept since the last one (GOMP_SPINCOUNT is short, see
# `cpu_threads`): at a decode step's few dozen rows that wake-up costs more than the loop.
SERIAL_BELOW = 4096
MAX_ENGINES = 64  # compiled engines in one process
# Inductor's C++ wrapper calls the graph's kernels and opaque ops from C++, not from a Python
# function, so with the C++ `packed_linear` (builtin_engine.model.packed_linear) no Python runs between a
# step's kernels and the gaps between its parallel regions shrink. It doubles the first compile.
OPTIONS = {"cpp.min_chunk_size": SERIAL_BELOW, "cpp_wrapper": True}


class CompiledStep:
    """A step of any mix of chunks through one compiled graph (see the module's docstring)."""

    def __init__(self, model: LlamaModel, kv_cache: KVCache, *, max_tokens: int, max_seqs: int, max_blocks: int,
                 block_size: int) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.max_tokens = max(max_tokens, MIN_SIZE)
        self.max_seqs = max(max_seqs, MIN_SIZE)
        self.max_samples = max(min(max_seqs, max_tokens), MIN_SIZE)
        self.max_blocks = max_blocks
        self.block_size = block_size
        torch._inductor.config.emulate_precision_casts = True  # round where the eager code rounds
        self._compiled = torch.compile(self._step, fullgraph=True, options=OPTIONS)
        self.failed = False  # a call would have recompiled: eager from then on

    def _step(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
              block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
              logits_indices: torch.Tensor) -> torch.Tensor:
        return self.model.step_logits(input_ids, positions, slot_mapping, block_tables, cu_seqlens_q, seq_lens,
                                      logits_indices, self.kv_cache)

    def inputs(self, chunks: Sequence[ScheduledChunk]) -> tuple[tuple[torch.Tensor, ...], int]:
        """The graph's arguments for `chunks` (padded) and how many of its logits rows are real."""
        bs, pad_slot = self.block_size, self.kv_cache.pad_block * self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu = [0]
        lens: list[int] = []
        samples: list[int] = []
        tables = torch.zeros((max(len(chunks), MIN_SIZE), self.max_blocks), dtype=torch.int32)
        rows = tables.numpy()
        for b, chunk in enumerate(chunks):
            seq, start, end = chunk.seq, chunk.start, chunk.end
            table = seq.block_table
            ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            cu.append(len(ids))
            lens.append(end)
            rows[b, : len(table)] = table
            if chunk.samples:
                samples.append(len(ids) - 1)
        num_samples = len(samples)
        pad_tokens = max(MIN_SIZE - len(ids), 0)
        ids += [0] * pad_tokens
        positions += [0] * pad_tokens
        slots += [pad_slot] * pad_tokens
        cu += [cu[-1]] * (MIN_SIZE - len(chunks))  # padding sequences: no tokens
        lens += [0] * (MIN_SIZE - len(chunks))
        samples += [0] * max(MIN_SIZE - len(samples), 0)
        return (torch.tensor(ids), torch.tensor(positions), torch.tensor(slots), tables,
                torch.tensor(cu, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32),
                torch.tensor(samples)), num_samples

    def fits(self, chunks: Sequence[ScheduledChunk]) -> bool:
        return not self.failed and all(c.seq.pooling is None for c in chunks)

    def warm_up(self) -> None:
        """Compile (or load from the cache) at the smallest sizes, then run at the largest without
        recompiling."""
        import kernels

        kernels.resolve_backend()  # the trace must see the kernel choice the engine will use
        # T, B, S: a symbol each, even when equal. Only those: after another engine's graph in this
        # process (its model's sizes differ) dynamo would also make the weights' sizes dynamic, a
        # graph that a process with this engine alone never compiles, so never in the cache. Every
        # engine's graph is an entry of the one `_step`, so the entries' limit is raised too.
        with torch.fx.experimental._config.patch(use_duck_shape=False), \
                torch._dynamo.config.patch(automatic_dynamic_shapes=False, recompile_limit=MAX_ENGINES):
            self._warm_up_once(MIN_SIZE, MIN_SIZE, MIN_SIZE, first=True)
        self._warm_up_once(self.max_tokens, self.max_seqs, self.max_samples, first=False)

    @torch.inference_mode()  # the tensors too: as in the runner, or the graph's guards fail on them
    def _warm_up_once(self, tokens: int, seqs: int, samples: int, *, first: bool) -> None:
        pad_slot = self.kv_cache.pad_block * self.block_size
        args = (torch.zeros(tokens, dtype=torch.int64), torch.zeros(tokens, dtype=torch.int64),
                torch.full((tokens,), pad_slot, dtype=torch.int64),
                torch.zeros((seqs, self.max_blocks), dtype=torch.int32), torch.zeros(seqs + 1, dtype=torch.int32),
                torch.zeros(seqs, dtype=torch.int32), torch.zeros(samples, dtype=torch.int64))
        if first:
            # bounds independent of the config: a cached graph compiled for other bounds would be
            # loaded with its own and fail to start the engine; these serve any token budget
            for tensor in args:
                sequences = tensor is args[3] or tensor is args[5]  # B, while cu_seqlens_q has B + 1
                torch._dynamo.mark_dynamic(tensor, 0, min=MIN_SIZE + (tensor is args[4]),
                                           max=MAX_SIZE - sequences)
        with torch.compiler.set_stance("default" if first else "fail_on_recompile"):
            self._compiled(*args)

    def run(self, chunks: Sequence[ScheduledChunk]) -> torch.Tensor | None:
        """Logits [sampling chunks, V] float32 in chunk order, or None when the step must run eagerly."""
        if not self.fits(chunks):
            return None
        args, num_samples = self.inputs(chunks)
        logits = run_compiled(self._compiled, args, "step")
        if logits is None:
            self.failed = True
            return None
        return logits[:num_samples]


def run_compiled(compiled: Callable[..., torch.Tensor], args: Sequence[torch.Tensor], what: str) -> torch.Tensor | None:
    """`compiled(*args)`, or None when that would recompile (the graph's guards failed): nothing
    is compiled while serving, the caller runs eagerly from then on."""
    try:
        with torch.compiler.set_stance("fail_on_recompile"):
            return compiled(*args)
    except RuntimeError as exc:
        if "recompil" not in str(exc).lower():
            raise
        _log.warning("the compiled %s no longer fits (%s); running eagerly from now on", what, exc)
        return None


def make_step_graph(model: LlamaModel, kv_cache: KVCache, config: EngineConfig,
                    max_model_len: int) -> CompiledStep | None:
    """The compiled step (not yet warmed up) where it applies: the CPU, with the C++ kernels built."""
    import kernels

    if model.device.type != "cpu" or not kernels.has_cpu_kernels():
        return None
    return CompiledStep(model, kv_cache, max_tokens=config.batched_tokens_on("cpu"), max_seqs=config.max_num_seqs,
                        max_blocks=-(-max_model_len // config.block_size), block_size=config.block_size)
