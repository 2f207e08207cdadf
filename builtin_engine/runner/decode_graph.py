"""The decode step captured in CUDA graphs (`CudaGraphDecode`).

A step whose chunks are all one-token decodes runs `LlamaModel.decode_logits` through one of
these instead of the eager layer loop (prefill and mixed steps stay eager, where aborts apply
between layers): one CUDA graph per batch size of `sizes`, sharing a memory pool; a step pads to
the next captured size and replays it. The step's inputs are written into persistent pinned host
buffers whose block-table width is fixed (the longest sequence's blocks), and the batch is
padded: rows past the real ones decode one token in the KV cache's pad block, which no sequence
owns. (On the CPU, `builtin_engine.runner.step_graph` compiles every step instead.)
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from builtin_engine.model.llama import KVCache, LlamaModel
from builtin_engine.scheduling.scheduler import ScheduledChunk


def default_cuda_graph_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then multiples of 8, up to max_num_seqs (always included)."""
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs] + list(range(8, max_num_seqs, 8)) + [max_num_seqs]
    return tuple(sorted(set(sizes)))


class DecodeInputs:
    """Persistent host buffers for one decode step of up to `max_batch` rows."""

    def __init__(self, *, max_batch: int, max_blocks: int, block_size: int, pad_block: int, pin: bool) -> None:
        def buffer(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, pin_memory=pin)

        self.block_size = block_size
        self.pad_block = pad_block
        self.input_ids = buffer(max_batch, dtype=torch.int64)
        self.positions = buffer(max_batch, dtype=torch.int64)
        self.slot_mapping = buffer(max_batch, dtype=torch.int64)
        self.block_tables = buffer(max_batch, max_blocks, dtype=torch.int32)  # [max_batch, max_blocks]
        self.seq_lens = buffer(max_batch, dtype=torch.int32)
        self._tables = self.block_tables.numpy()  # row writes from lists, without a tensor per row

    def fill(self, chunks: Sequence[ScheduledChunk], padded: int) -> None:
        """Rows of `chunks` (one-token chunks), then pad-block rows up to `padded`."""
        bs = self.block_size
        ids, positions, slots, lens = [], [], [], []
        for row, chunk in enumerate(chunks):
            seq, position = chunk.seq, chunk.start
            table = seq.block_table
            ids.append(seq.token_ids[position])
            positions.append(position)
            slots.append(table[position // bs] * bs + position % bs)
            lens.append(position + 1)
            self._tables[row, : len(table)] = table
        num_pad = padded - len(chunks)
        self._tables[len(chunks):padded, 0] = self.pad_block
        self.input_ids[:padded] = torch.tensor(ids + [0] * num_pad)
        self.positions[:padded] = torch.tensor(positions + [0] * num_pad)
        self.slot_mapping[:padded] = torch.tensor(slots + [self.pad_block * bs] * num_pad)
        self.seq_lens[:padded] = torch.tensor(lens + [1] * num_pad, dtype=torch.int32)

    def tensors(self, rows: int) -> tuple[torch.Tensor, ...]:
        return (self.input_ids[:rows], self.positions[:rows], self.slot_mapping[:rows], self.block_tables[:rows],
                self.seq_lens[:rows])


class CudaGraphDecode:
    """The decode step captured in CUDA graphs, one per batch size (see the module's docstring)."""

    def __init__(self, model: LlamaModel, kv_cache: KVCache, *, sizes: Sequence[int], max_blocks: int,
                 block_size: int) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.sizes = tuple(sorted(set(sizes)))
        self.max_batch = self.sizes[-1]
        self.inputs = DecodeInputs(max_batch=self.max_batch, max_blocks=max_blocks, block_size=block_size,
                                   pad_block=kv_cache.pad_block, pin=True)
        device = model.device
        self.device_inputs = tuple(t.to(device) for t in self.inputs.tensors(self.max_batch))
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def warm_up(self) -> None:
        """Run each size once (Triton compiles its kernels), then capture it, largest first."""
        pool = torch.cuda.graph_pool_handle()
        self.inputs.fill([], self.max_batch)
        for static, host in zip(self.device_inputs, self.inputs.tensors(self.max_batch)):
            static.copy_(host)
        with torch.inference_mode():
            for rows in reversed(self.sizes):
                args = [t[:rows] for t in self.device_inputs]
                stream = torch.cuda.Stream(self.model.device)
                stream.wait_stream(torch.cuda.current_stream(self.model.device))
                with torch.cuda.stream(stream):
                    self.model.decode_logits(*args, self.kv_cache)
                torch.cuda.current_stream(self.model.device).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    logits = self.model.decode_logits(*args, self.kv_cache)
                self.graphs[rows] = (graph, logits)
        torch.cuda.synchronize(self.model.device)

    def run(self, chunks: Sequence[ScheduledChunk]) -> torch.Tensor | None:
        """Logits [len(chunks), V] float32, or None when no captured size fits."""
        rows = next((size for size in self.sizes if size >= len(chunks)), None)
        if rows is None:
            return None
        self.inputs.fill(chunks, rows)
        for static, host in zip(self.device_inputs, self.inputs.tensors(rows)):
            static[:rows].copy_(host, non_blocking=True)
        graph, logits = self.graphs[rows]
        graph.replay()
        return logits[: len(chunks)]


def make_decode_graph(model: LlamaModel, kv_cache: KVCache, *, max_num_seqs: int, max_model_len: int,
                      block_size: int, cuda_graph_sizes: Sequence[int] | None) -> CudaGraphDecode | None:
    """The captured decode step on CUDA; None elsewhere."""
    if model.device.type != "cuda":
        return None
    sizes = cuda_graph_sizes or default_cuda_graph_sizes(max_num_seqs)
    return CudaGraphDecode(model, kv_cache, sizes=sizes, max_blocks=-(-max_model_len // block_size),
                           block_size=block_size)
