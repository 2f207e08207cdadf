"""`EngineService`: the engine's calls (`builtin_engine.process.calls`) served by one `LLMEngine`.

The built-in backend calls it directly when the engine runs in the gateway's process; the engine
process (`builtin_engine.process.server`) serves the same calls to every gateway worker. Either
way a request's grammar is compiled here, next to the vocabulary it masks (off the event loop,
cached), and a stream closed early aborts its request in the engine.

`STREAMS` and `RESULTS` are the one dispatch table: which method serves each call struct.
`stream(call)` / `call(call)` go through it here, and `builtin_engine.process.client.EngineClient` has
the same two methods over ZeroMQ, so a new call needs its struct, its method and its entry.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from builtin_engine.outputs import RequestOutput
from builtin_engine.process.calls import (
    Describe,
    Embed,
    EngineInfo,
    EngineLaunch,
    EngineStats,
    Generate,
    Stats,
    sampling_params,
)

if TYPE_CHECKING:
    from builtin_engine.engine import LLMEngine
    from builtin_engine.text.structured import Grammar, GrammarCompiler
    from builtin_engine.text.tokenizer import Tokenizer


class EngineService:
    def __init__(self, llm_engine: LLMEngine, tokenizer: Tokenizer) -> None:
        self.llm_engine = llm_engine
        self.tokenizer = tokenizer
        self.grammar_compiler: GrammarCompiler | None = None  # built on the first structured request
        self.info = EngineInfo(max_model_len=llm_engine.max_model_len, vocab_size=llm_engine.model_config.vocab_size,
                               hidden_size=llm_engine.model_config.hidden_size, pid=os.getpid(),
                               placement=llm_engine.placement.describe())

    @classmethod
    def load(cls, launch: EngineLaunch) -> EngineService:
        """Load the checkpoint and start the engine's step thread (blocking: seconds). Raises
        `TokenizerError`, `UnsupportedModelError` or `ValueError` (settings that do not fit)."""
        from builtin_engine.engine import LLMEngine
        from builtin_engine.text.detokenizer import IncrementalDetokenizer
        from builtin_engine.text.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_dir(launch.model_dir)
        engine = LLMEngine.from_model_dir(
            launch.model_dir,
            config=launch.config,
            eos_token_ids=tokenizer.eos_token_ids,
            detokenizer_factory=lambda prompt_ids, skip: IncrementalDetokenizer(
                tokenizer, skip_special_tokens=skip, prompt_ids=prompt_ids),
        )
        engine.start()
        return cls(engine, tokenizer)

    @property
    def max_model_len(self) -> int:
        return self.info.max_model_len

    # ---- the calls ------------------------------------------------------------------------------

    def stream(self, call: Any) -> AsyncIterator[Any]:
        """A streamed call's items (`STREAMS`)."""
        return STREAMS[type(call)](self, call)

    async def call(self, call: Any) -> Any:
        """A call's one result (`RESULTS`)."""
        return await RESULTS[type(call)](self, call)

    async def generate(self, call: Generate) -> AsyncIterator[RequestOutput]:
        grammar = await self._grammar(call)
        params = sampling_params(call.sampling, grammar)
        handle = self.llm_engine.add_request(call.prompt_ids, params, priority=call.priority, request_id=call.request_id)
        try:
            async for output in handle:
                yield output
        finally:
            if not handle.finished:
                self.llm_engine.abort(handle.request_id)

    async def embed(self, call: Embed) -> AsyncIterator[RequestOutput]:
        from builtin_engine.pooling import PoolingParams

        engine = self.llm_engine
        params = PoolingParams(method=call.pooling, normalize=call.normalize, dimensions=call.dimensions)
        window = max(1, min(engine.config.max_num_seqs, engine.config.max_waiting // 2))  # never fills the queue
        handles = []
        try:
            for start in range(0, len(call.prompts), window):
                handles = []
                for i, prompt in enumerate(call.prompts[start : start + window], start):
                    handles.append(engine.add_pooling_request(prompt, params, request_id=f"{call.request_id}-{i}"))
                for handle in handles:
                    async for output in handle:
                        if output.embedding is not None:
                            yield output
        finally:
            for handle in handles:
                if not handle.finished:
                    engine.abort(handle.request_id)

    def abort(self, request_id: str, requested_at: float | None = None) -> None:
        self.llm_engine.abort(request_id, requested_at=requested_at)

    async def describe(self, call: Describe | None = None) -> EngineInfo:
        return self.info

    async def stats(self, call: Stats | None = None) -> EngineStats:
        return self.snapshot()

    def snapshot(self) -> EngineStats:
        """The engine's counts now (read directly from its scheduler)."""
        engine = self.llm_engine
        return EngineStats(
            alive=engine.is_alive(), num_unfinished_requests=engine.num_unfinished_requests,
            num_running_seqs=engine.num_running_seqs,
            num_free_blocks=engine.block_manager.num_free_blocks, num_blocks=engine.block_manager.num_blocks,
            num_steps=engine.num_steps, abort_latencies=list(engine.abort_latencies),
        )

    def in_flight(self) -> int:
        """Requests the engine still holds (queued or running, sequences and KV blocks not freed)."""
        return self.llm_engine.num_unfinished_requests

    def num_unfinished(self) -> int:
        """Requests running or waiting in the engine: exact, read now."""
        return self.in_flight()

    async def health(self) -> bool:
        return self.llm_engine.is_alive()

    async def close(self) -> None:
        await asyncio.to_thread(self.llm_engine.shutdown)

    # ---- structured outputs ---------------------------------------------------------------------

    async def _grammar(self, call: Generate) -> Grammar | None:
        """The request's compiled grammar (None: unconstrained); a spec that does not compile
        raises `InvalidRequestError` naming its field."""
        if call.grammar is None:
            return None
        compiler = self.grammar_compiler or await asyncio.to_thread(self._make_grammar_compiler)
        stops = call.sampling.get("stop_token_ids") or ()
        return compiler.cached(call.grammar, stop_token_ids=stops) or await asyncio.to_thread(
            compiler.compile, call.grammar, stop_token_ids=stops)

    def _make_grammar_compiler(self) -> GrammarCompiler:
        from builtin_engine.text.structured import GrammarCompiler

        if self.grammar_compiler is None:
            self.grammar_compiler = GrammarCompiler(self.tokenizer, vocab_size=self.info.vocab_size,
                                                    stop_token_ids=self.llm_engine.eos_token_ids)
        return self.grammar_compiler


# The dispatch table: the method that serves each call.
STREAMS: dict[type, Callable[[EngineService, Any], AsyncIterator[Any]]] = {
    Generate: EngineService.generate,
    Embed: EngineService.embed,
}
RESULTS: dict[type, Callable[[EngineService, Any], Awaitable[Any]]] = {
    Describe: EngineService.describe,
    Stats: EngineService.stats,
}
