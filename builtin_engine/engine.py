"""`LLMEngine`: requests in, per-step outputs out, a step loop in its own thread.

    handle = engine.add_request(prompt_ids, params, priority=0)   # raises before scheduling
    async for output in handle: ...                               # on the loop that added it
    engine.abort(handle.request_id)                               # any thread; within one layer
    handle = engine.add_pooling_request(prompt_ids, PoolingParams())  # an embedding: one output

`add_request` validates and enqueues (any thread). The step thread, between steps, admits new
requests and applies aborts; each step schedules, runs the model, samples, detokenizes and
checks stops, then hands each touched request's `RequestOutput` to its event loop (see
`request_handle`). An abort that arrives during a step is applied between two layers of the
forward: the request's rows leave the batch and its blocks are freed then, not at the step's
end. Without the thread, `step()` / `run_until_done()` drive it by hand.
"""

from __future__ import annotations

import collections
import itertools
import logging
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from builtin_engine.config import EngineConfig
from builtin_engine.errors import ContextLengthExceeded, EngineDeadError, InvalidRequestError, QueueFull
from builtin_engine.model.llama import KVCache, LlamaModel
from builtin_engine.model.loader import ModelConfig, load_weights, read_model_config
from builtin_engine.output_processor import ChoiceState, Detokenizer
from builtin_engine.outputs import ChoiceOutput, RequestOutput
from builtin_engine.pooling import PoolingParams
from builtin_engine.request_handle import RequestHandle, deliver
from builtin_engine.runner.cpu_threads import call_in_own_thread
from builtin_engine.runner.decode_graph import make_decode_graph
from builtin_engine.runner.device import Placement, resolve_placement
from builtin_engine.runner.model_runner import ModelRunner
from builtin_engine.runner.sampler import Sampler, SamplerOutput, choice_seed
from builtin_engine.runner.step_graph import make_step_graph
from builtin_engine.scheduling.block_manager import BlockManager
from builtin_engine.scheduling.sampling_params import SamplingParams
from builtin_engine.scheduling.scheduler import Scheduler, SchedulerOutput
from builtin_engine.scheduling.sequence import Sequence

DetokenizerFactory = Callable[[list[int], bool], Detokenizer]  # (prompt ids, skip_special_tokens) -> new
_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StepStats:
    """What the last step did (metrics, tests)."""

    num_decode_seqs: int = 0
    num_prefill_seqs: int = 0
    num_prefill_tokens: int = 0
    num_preempted: int = 0
    num_sampled: int = 0


@dataclass(slots=True)
class _Request:
    request_id: str
    handle: RequestHandle
    seqs: list[Sequence]  # one per choice; seqs[0] leads
    choices: list[ChoiceState]
    num_unfinished: int
    scheduled: bool = False  # its leader has been scheduled (it left the waiting queue's count)
    pending: list[ChoiceOutput] = field(default_factory=list)  # this step's news


class LLMEngine:
    def __init__(
        self,
        model: LlamaModel,
        *,
        config: EngineConfig | None = None,
        eos_token_ids: Iterable[int] = (),
        detokenizer_factory: DetokenizerFactory | None = None,
        placement: Placement | None = None,
    ) -> None:
        """`eos_token_ids` add to the model's (config.json, generation_config.json); without a
        `detokenizer_factory` outputs carry token ids only and stop strings never match.
        `placement` (see `from_model_dir`) says whether the decode step is compiled or captured;
        default: eager on the model's device. A compiled step is compiled and run here."""
        config = config or EngineConfig()
        self.config = config
        self.placement = placement or Placement(device=model.device, dtype=str(model.dtype).removeprefix("torch."),
                                                compile=False)  # type: ignore[arg-type]
        self.model_config = model.config
        self.max_model_len = resolve_max_model_len(model.config, config)
        self.eos_token_ids = frozenset(model.config.eos_token_ids) | frozenset(eos_token_ids)
        self.detokenizer_factory = detokenizer_factory
        self.block_manager = BlockManager(num_blocks=config.num_kv_blocks, block_size=config.block_size,
                                          enable_prefix_caching=config.enable_prefix_caching)
        self.scheduler = Scheduler(block_manager=self.block_manager, max_num_seqs=config.max_num_seqs,
                                   max_num_batched_tokens=config.batched_tokens_on(model.device.type))
        kv_cache = KVCache.allocate(model.config, num_blocks=config.num_kv_blocks, block_size=config.block_size,
                                    dtype=model.dtype, device=model.device)
        sampler = Sampler(eos_token_ids=self.eos_token_ids, logprobs_mode=config.logprobs_mode)
        # on the CPU one compiled graph serves every step (builtin_engine.runner.step_graph); on CUDA the
        # all-decode steps replay CUDA graphs (builtin_engine.runner.decode_graph)
        step_graph = make_step_graph(model, kv_cache, config, self.max_model_len) if self.placement.compile else None
        decode_graph = None
        if self.placement.compile and step_graph is None:
            decode_graph = make_decode_graph(model, kv_cache, max_num_seqs=config.max_num_seqs,
                                             max_model_len=self.max_model_len, block_size=config.block_size,
                                             cuda_graph_sizes=config.cuda_graph_batch_sizes)
        if step_graph is not None or decode_graph is not None:
            started = time.perf_counter()
            (step_graph or decode_graph).warm_up()
            _log.info("%s prepared in %.1f s (%s)", "every step" if step_graph else "decode step",
                      time.perf_counter() - started, self.placement.describe())
        self.runner = ModelRunner(model, kv_cache=kv_cache, block_size=config.block_size, sampler=sampler,
                                  decode_graph=decode_graph, step_graph=step_graph)
        self.num_steps = 0
        self.last_step = StepStats()
        self._requests: dict[str, _Request] = {}  # the step thread's
        self._lock = threading.Condition()  # guards the four fields below
        self._inbox: list[_Request] = []
        self._aborts: list[tuple[str, float]] = []  # (request id, time.monotonic() of the call)
        self._num_queued = 0  # requests added whose leader has not been scheduled yet
        self._stopping = False
        self._seq_ids = itertools.count()
        self._arrivals = itertools.count()
        self._random = random.Random()
        self._thread: threading.Thread | None = None
        self._fatal: BaseException | None = None
        # seconds from each `abort()` call to its request's blocks being freed, latest last
        self.abort_latencies: collections.deque[float] = collections.deque(maxlen=256)
        if model.device.type == "cuda":
            started = time.perf_counter()
            self.warm_up_kernels()
            _log.info("kernels warmed up in %.1f s", time.perf_counter() - started)

    @classmethod
    def from_model_dir(
        cls,
        model_dir: str | Path,
        *,
        config: EngineConfig | None = None,
        eos_token_ids: Iterable[int] = (),
        detokenizer_factory: DetokenizerFactory | None = None,
    ) -> LLMEngine:
        """Load a checkpoint directory (see `builtin_engine.model.loader`) onto the configured device
        and build the engine, in a thread of its own (see `builtin_engine.runner.cpu_threads`). Raises
        `DeviceError` (a ValueError naming the setting) when the device, dtype or compile
        settings do not fit this machine, before anything is loaded."""
        config = config or EngineConfig()
        placement = resolve_placement(config.device, config.dtype, config.compile)
        if placement.dtype == "bfloat16" and config.matmul_dtype == "float32":
            raise ValueError("matmul_dtype float32 needs dtype float32 (bfloat16 weights gain nothing from it)")
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)

        def build() -> LLMEngine:
            model_config = read_model_config(Path(model_dir))
            weights = load_weights(Path(model_dir), model_config, placement.dtype)
            if placement.device.type != "cpu":
                weights = weights.to(placement.device)
            matmul_dtype = getattr(torch, config.matmul_dtype) if config.matmul_dtype else None
            model = LlamaModel(model_config, weights, max_positions=resolve_max_model_len(model_config, config),
                               matmul_dtype=matmul_dtype)
            return cls(model, config=config, eos_token_ids=eos_token_ids, detokenizer_factory=detokenizer_factory,
                       placement=placement)

        return call_in_own_thread(build, name="builtin-engine-load")

    # ---- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the step thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="builtin-engine-step", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the step thread after its current step; waiting requests get `EngineDeadError`."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        self._fail_all(EngineDeadError("the engine was shut down"))

    def is_alive(self) -> bool:
        """Liveness: the step thread runs and has not crashed."""
        return self._thread is not None and self._thread.is_alive() and self._fatal is None

    # ---- requests (any thread) ------------------------------------------------------------------

    def add_request(self, prompt_ids: list[int], params: SamplingParams, *, priority: int = 0,
                    request_id: str | None = None) -> RequestHandle:
        """Validate and enqueue; lower `priority` runs first. Raises `InvalidRequestError`,
        `ContextLengthExceeded`, `QueueFull` or `EngineDeadError`, before anything is scheduled.
        `request_id` must be unique among live requests (default: a fresh uuid)."""
        if self._fatal is not None or self._stopping:
            raise EngineDeadError("the engine is not running") from self._fatal
        max_tokens = self.check_request(prompt_ids, params)
        request = self._new_request(request_id or uuid.uuid4().hex, prompt_ids, params, priority, max_tokens)
        return self._enqueue(request)

    def add_pooling_request(self, prompt_ids: list[int], pooling: PoolingParams, *, priority: int = 0,
                            request_id: str | None = None) -> RequestHandle:
        """A request whose one output is its prompt's pooled hidden state (`embedding`; see
        `builtin_engine.pooling`), scheduled and batched like any prompt. Raises as `add_request`."""
        if self._fatal is not None or self._stopping:
            raise EngineDeadError("the engine is not running") from self._fatal
        self._check_prompt(prompt_ids)
        if len(prompt_ids) > self.max_model_len:
            raise InvalidRequestError(f"The input is {len(prompt_ids)} tokens, longer than the model's maximum context "
                                      f"length ({self.max_model_len} tokens).", param="input")
        size = self.model_config.hidden_size
        if pooling.dimensions is not None and not 1 <= pooling.dimensions <= size:
            raise InvalidRequestError(f"`dimensions` must be in [1, {size}].", param="dimensions")
        request = self._new_request(request_id or uuid.uuid4().hex, prompt_ids, SamplingParams(max_tokens=1), priority,
                                    1, pooling=pooling)
        return self._enqueue(request)

    def _enqueue(self, request: _Request) -> RequestHandle:
        with self._lock:
            if self._num_queued >= self.config.max_waiting:
                raise QueueFull(self.config.max_waiting)
            self._num_queued += 1
            self._inbox.append(request)
            self._lock.notify_all()
        return request.handle

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> int:
        """Validate a request; return its max_tokens (None resolved to the rest of the context)."""
        self._check_prompt(prompt_ids)
        vocab = self.model_config.vocab_size
        params.validate(vocab_size=vocab, max_top_logprobs=self.config.max_top_logprobs)
        room = self.max_model_len - len(prompt_ids)
        if room < 1 or (params.max_tokens is not None and params.max_tokens > room):
            raise ContextLengthExceeded(num_prompt_tokens=len(prompt_ids), max_tokens=params.max_tokens,
                                        max_model_len=self.max_model_len)
        return params.max_tokens if params.max_tokens is not None else room

    def _check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise InvalidRequestError("The prompt is empty.", param="prompt")
        vocab = self.model_config.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise InvalidRequestError(f"The prompt holds a token id outside the vocabulary (size {vocab}).",
                                      param="prompt")

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, priority: int = 0,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """`add_request`, then its outputs; closing the iterator early aborts the request."""
        handle = self.add_request(prompt_ids, params, priority=priority, request_id=request_id)
        try:
            async for output in handle:
                yield output
        finally:
            if not handle.finished:
                self.abort(handle.request_id)

    def abort(self, request_id: str, *, requested_at: float | None = None) -> None:
        """Free the request's sequences and KV blocks: before the next layer of a running step,
        or before the next step. Unknown ids are ignored. `requested_at`: the `time.monotonic()`
        at which the abort was asked for elsewhere (another process; the clock is the machine's),
        from which `abort_latencies` then counts."""
        with self._lock:
            self._aborts.append((request_id, time.monotonic() if requested_at is None else requested_at))
            self._lock.notify_all()

    def _new_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams, priority: int,
                     max_tokens: int, pooling: PoolingParams | None = None) -> _Request:
        seed = params.seed if params.seed is not None else self._random.getrandbits(63)
        arrival = next(self._arrivals)
        seqs: list[Sequence] = []
        for index in range(params.n):
            seqs.append(Sequence(
                seq_id=next(self._seq_ids), request_id=request_id, index=index, prompt_ids=prompt_ids,
                params=params, priority=priority, arrival=arrival, seed=choice_seed(seed, index),
                max_tokens=max_tokens, waits_for=seqs[0] if seqs else None, pooling=pooling,
            ))
        factory = self.detokenizer_factory if pooling is None else None
        choices = [
            ChoiceState(seq, eos_token_ids=self.eos_token_ids,
                        detokenizer=factory(prompt_ids, params.skip_special_tokens) if factory else None)
            for seq in seqs
        ]
        return _Request(request_id, RequestHandle.for_current_loop(request_id), seqs, choices,
                        num_unfinished=len(seqs))

    def warm_up_kernels(self) -> None:
        """Run a few short requests through prefill, mixed prefill-and-decode steps and both
        samplers, then forget them (prefix cache, step counts). On CUDA each Triton kernel compiles
        at its first launch, once per specialization of its integer arguments (1, multiples of 16),
        seconds in all: done before the engine serves, no client's request waits for it.
        Call before `start()`."""
        greedy = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
        sampled = SamplingParams(temperature=0.8, top_k=5, top_p=0.9, max_tokens=3, ignore_eos=True, seed=0)
        vocab = self.model_config.vocab_size
        for lengths in ((3, 16), (17, 33)):  # the second pair arrives while the first decodes
            for length, params in zip(lengths, (greedy, sampled)):
                length = min(length, self.max_model_len - params.max_tokens)  # a tiny configured context
                if length >= 1:
                    self.add_request([i % vocab for i in range(1, length + 1)], params)
            self.step()
        self.run_until_done()
        self.block_manager.reset_prefix_cache()
        self.num_steps = 0
        self.last_step = StepStats()
        self.runner.num_graph_steps = 0

    # ---- the step loop --------------------------------------------------------------------------

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._inbox or self._aborts) or self.scheduler.has_work()

    def step(self) -> None:
        """Admit and abort, then schedule, run and process one batch."""
        self._admit_and_abort()
        out = self.scheduler.schedule()
        if out.is_empty:
            return
        self._count_scheduled(out)
        seqs, sampled = self.runner.execute(out.chunks, poll_aborted=self._poll_aborted)
        self.scheduler.update_after_step(out)  # skips the chunks of requests aborted mid-step
        self.num_steps += 1
        self.last_step = _step_stats(out, len(seqs))
        if sampled is not None:
            self._process_samples(seqs, sampled)
        self._finish_pooled(out)

    def run_until_done(self) -> None:
        """Step in this thread until nothing is left (scripts and tests; not with the thread)."""
        if self._thread is not None:
            raise RuntimeError("run_until_done() drives the engine by hand, but the step thread runs")
        while self.has_work():
            self.step()

    def _process_samples(self, seqs: list[Sequence], sampled: SamplerOutput) -> None:
        touched: dict[str, _Request] = {}
        for seq, token_id, logprobs in zip(seqs, sampled.token_ids, sampled.logprobs):
            seq.append_token(token_id)
            request = self._requests[seq.request_id]
            choice = request.choices[seq.index].on_token(token_id, logprobs)
            if choice.finish_reason is not None:
                self.scheduler.finish(seq)
                request.num_unfinished -= 1
            request.pending.append(choice)
            touched[request.request_id] = request
        orphans = deliver([(r.handle, self._take_output(r)) for r in touched.values()])
        for handle in orphans:
            self.abort(handle.request_id)

    def _finish_pooled(self, out: SchedulerOutput) -> None:
        """Pooling sequences whose prompt is all computed now: finish them with their vector."""
        done: list[tuple[RequestHandle, RequestOutput]] = []
        for chunk in out.chunks:
            seq = chunk.seq
            if seq.pooling is None or seq.is_finished or seq.num_computed_tokens < seq.num_tokens:
                continue
            self.scheduler.finish(seq)
            request = self._requests.pop(seq.request_id)
            done.append((request.handle, RequestOutput(
                request_id=seq.request_id, num_prompt_tokens=seq.num_prompt_tokens,
                num_cached_tokens=seq.num_cached_tokens or 0, finished=True, embedding=seq.pooling.result(),
            )))
        for handle in deliver(done) if done else ():
            self.abort(handle.request_id)

    def _take_output(self, request: _Request) -> RequestOutput:
        leader = request.seqs[0]
        output = RequestOutput(
            request_id=request.request_id,
            choices=request.pending,
            num_prompt_tokens=leader.num_prompt_tokens,
            num_cached_tokens=leader.num_cached_tokens or 0,
            num_output_tokens=sum(s.num_output_tokens for s in request.seqs),
            finished=request.num_unfinished == 0,
        )
        request.pending = []
        if output.finished:
            del self._requests[request.request_id]
        return output

    def _count_scheduled(self, out: SchedulerOutput) -> None:
        """Requests scheduled for the first time leave the bounded waiting queue."""
        num_new = 0
        for chunk in out.chunks:
            request = self._requests[chunk.seq.request_id]
            if not request.scheduled:
                request.scheduled = True
                num_new += 1
        if num_new:
            with self._lock:
                self._num_queued -= num_new

    def _poll_aborted(self) -> set[str] | tuple[()]:
        """The model runner's check between layers: apply the aborts that came in since, return
        the ids of the requests they ended (the runner drops their rows)."""
        if not self._aborts:  # unlocked peek: a list's truthiness is atomic, a miss waits one layer
            return ()
        return self._admit_and_abort()

    def _admit_and_abort(self) -> set[str]:
        """Admit new requests to the scheduler's queue, apply aborts (finish the requests' sequences,
        free their blocks); return the ids of the requests aborted. Safe within a step: admitted
        requests wait for the next schedule, and aborted ones must leave the running batch."""
        with self._lock:
            inbox, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
        for request in inbox:
            self._requests[request.request_id] = request
            for seq in request.seqs:
                self.scheduler.add(seq)
        aborted: set[str] = set()
        now = time.monotonic()
        for request_id, called_at in aborts:
            request = self._requests.pop(request_id, None)
            if request is None:
                continue
            for seq in request.seqs:
                if not seq.is_finished:
                    self.scheduler.finish(seq)
            if not request.scheduled:
                with self._lock:
                    self._num_queued -= 1
            aborted.add(request_id)
            self.abort_latencies.append(now - called_at)
        return aborted

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    while not (self._stopping or self._inbox or self._aborts or self.scheduler.has_work()):
                        self._lock.wait()
                    if self._stopping:
                        return
                self.step()
        except BaseException as exc:  # the engine is dead: tell everyone waiting
            _log.exception("the engine's step loop crashed")
            self._fatal = exc
            self._fail_all(EngineDeadError(f"the engine's step loop crashed: {exc!r}"))

    def _fail_all(self, error: EngineDeadError) -> None:
        with self._lock:
            inbox, self._inbox = self._inbox, []
        requests, self._requests = [*self._requests.values(), *inbox], {}
        deliver([(r.handle, error) for r in requests])

    # ---- introspection --------------------------------------------------------------------------

    @property
    def num_unfinished_requests(self) -> int:
        with self._lock:
            return len(self._requests) + len(self._inbox)

    @property
    def num_running_seqs(self) -> int:
        """Sequences in the running batch (a snapshot when read from another thread)."""
        return len(self.scheduler.running)

    def running_request_ids(self) -> set[str]:
        """Requests with a sequence in the running batch (a snapshot from another thread)."""
        return {seq.request_id for seq in list(self.scheduler.running)}


def _step_stats(out: SchedulerOutput, num_sampled: int) -> StepStats:
    num_decode = sum(1 for c in out.chunks if c.is_decode)
    return StepStats(num_decode_seqs=num_decode, num_prefill_seqs=len(out.chunks) - num_decode,
                     num_prefill_tokens=out.num_tokens - num_decode, num_preempted=len(out.preempted),
                     num_sampled=num_sampled)


def resolve_max_model_len(model_config: ModelConfig, config: EngineConfig) -> int:
    """The configured max_model_len, or the model's, capped by the KV cache and a sliding window.
    Raises ValueError when a configured value does not fit."""
    limit = config.num_kv_blocks * config.block_size
    if model_config.sliding_window is not None:
        limit = min(limit, model_config.sliding_window)
    if config.max_model_len is None:
        return min(model_config.max_position_embeddings, limit)
    if config.max_model_len > model_config.max_position_embeddings:
        raise ValueError(
            f"max_model_len {config.max_model_len} exceeds the model's max_position_embeddings "
            f"{model_config.max_position_embeddings}"
        )
    if config.max_model_len > limit:
        raise ValueError(
            f"max_model_len {config.max_model_len} exceeds what kv_cache_tokens (or the model's sliding "
            f"window) allows: {limit} tokens"
        )
    return config.max_model_len
