"""Backend type `transformers`: Hugging Face transformers' `generate()` as an engine.

One worker thread runs one `generate()` at a time; a streamer hands each new token id to the
request's asyncio queue, and the request's coroutine decodes, cuts stop strings and yields
events. Closing the stream sets the request's cancel flag, which a `StoppingCriteria` reads
before every token, so the worker moves on within one decoding step.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import msgspec

from switchyard.plugin import (
    PLUGIN_API_VERSION,
    BackendType,
    Capabilities,
    ConfigError,
    ContextLengthExceeded,
    Event,
    Finish,
    InvalidRequest,
    ModelInfo,
    ModelNotFound,
    Rendered,
    RequestSpec,
    TextDelta,
    TokenizeRequest,
    TokenizeResult,
    UpstreamError,
    Usage,
    hookimpl,
    model_dir,
)

if PLUGIN_API_VERSION[0] != 1:
    raise ImportError(f"switchyard-transformers needs Switchyard's plugin API 1.x, not {PLUGIN_API_VERSION}")

EXTENSIONS = frozenset({"top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos"})


class TransformersOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    model: str = "smollm2-135m-instruct"  # a model Switchyard bundles, or an HF checkpoint directory
    served_model_name: str | None = None  # default: `model` (a directory: its name)
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    num_threads: int | None = None  # torch CPU threads (process-wide)
    dtype: Literal["float32", "bfloat16"] = "float32"


class _Job:
    """One generate() call: token ids flow from the worker thread to the request's queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[list[int] | BaseException | None] = asyncio.Queue()
        self.cancelled = threading.Event()

    def push(self, item: list[int] | BaseException | None) -> None:  # from the worker thread
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class TransformersBackend:
    def __init__(self, name: str, options: TransformersOptions) -> None:
        self.name = name
        self.options = options
        self.served = options.served_model_name or options.model.rstrip("/").rsplit("/", 1)[-1]
        self.model: Any = None
        self.tokenizer: Any = None
        self.max_model_len = options.max_model_len or 0
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"transformers-{name}")
        self._jobs: set[_Job] = set()  # submitted, not yet done
        self._eos: set[int] = set()

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        if self.model is None:
            await asyncio.get_running_loop().run_in_executor(self._worker, self._load)

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no bars in the gateway's log
        path = model_dir(self.options.model)
        if self.options.num_threads:
            torch.set_num_threads(self.options.num_threads)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, self.options.dtype))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"backend {self.name!r}, option `model`: {exc}") from exc
        self.max_model_len = self.options.max_model_len or model.config.max_position_embeddings
        eos = model.generation_config.eos_token_id
        self._eos = set(eos if isinstance(eos, list) else [eos])
        self.model = model.eval()

    async def close(self) -> None:
        for job in list(self._jobs):
            job.cancelled.set()
        await asyncio.to_thread(self._worker.shutdown, wait=True)
        self.model = None

    async def health(self) -> bool:
        return self.model is not None

    def in_flight(self) -> int:
        return len(self._jobs)

    def capabilities(self) -> Capabilities:
        return Capabilities(extensions=EXTENSIONS, max_model_len=self.max_model_len or None)

    async def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=self.served, max_model_len=self.max_model_len or None, owned_by=self.name)]

    # -- tokens --------------------------------------------------------------------------------

    def _prompt_ids(self, request: RequestSpec | TokenizeRequest) -> list[int]:
        if request.upstream_model != self.served:
            raise ModelNotFound(request.upstream_model)
        if self.model is None:
            raise UpstreamError(f"backend {self.name!r} is not started", kind="unavailable")
        if request.messages is not None:
            text = self.tokenizer.apply_chat_template(
                request.messages, tokenize=False, add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message, **(request.chat_template_kwargs or {}))
            return self.tokenizer(text, add_special_tokens=False).input_ids
        if isinstance(request.prompt, str):
            return self.tokenizer(request.prompt).input_ids
        ids = list(request.prompt or ())
        if not ids or not all(0 <= t < len(self.tokenizer) for t in ids):
            raise InvalidRequest(f"Token ids must be in [0, {len(self.tokenizer)}).", param="prompt")
        return ids

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        return TokenizeResult(tokens=self._prompt_ids(request), max_model_len=self.max_model_len)

    async def detokenize(self, upstream_model: str, tokens: list[int]) -> str:
        if upstream_model != self.served:
            raise ModelNotFound(upstream_model)
        return self.tokenizer.decode(tokens)

    async def render(self, upstream_model: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                     chat_template_kwargs: dict[str, Any] | None = None, **_: Any) -> Rendered:
        ids = self._prompt_ids(TokenizeRequest(upstream_model=upstream_model, messages=messages,
                                               add_generation_prompt=add_generation_prompt,
                                               chat_template_kwargs=chat_template_kwargs))
        return Rendered(text=self.tokenizer.decode(ids), tokens=ids)

    # -- generation ----------------------------------------------------------------------------

    async def generate(self, spec: RequestSpec) -> AsyncIterator[Event]:
        s = spec.sampling
        if s.presence_penalty or s.frequency_penalty or s.logit_bias:
            raise InvalidRequest("presence_penalty, frequency_penalty and logit_bias are not supported by "
                                 f"backend `{self.name}`.", param="presence_penalty")
        prompt = self._prompt_ids(spec)
        room = self.max_model_len - len(prompt)
        if room < 1 or (s.max_tokens or 0) > room:
            raise ContextLengthExceeded(f"The prompt ({len(prompt)} tokens) and max_tokens ({s.max_tokens}) do not fit "
                                        f"max_model_len={self.max_model_len}.",
                                        param="messages" if spec.kind == "chat" else "prompt")
        limit = s.max_tokens or room
        completion_tokens = 0
        for index in range(s.n):
            job = self._submit(prompt, limit, spec, seed=None if s.seed is None else s.seed + index)
            try:
                ids: list[int] = []
                async for delta, ids, reason in self._decode(job, limit, s.stop, s.ignore_eos):
                    if delta:
                        yield TextDelta(text=delta, index=index)
                    if reason is not None:
                        yield Finish(reason=reason, index=index)
                completion_tokens += len(ids)
            finally:
                job.cancelled.set()  # the worker stops at its next token (or never starts)
        yield Usage(prompt_tokens=len(prompt), completion_tokens=completion_tokens)

    async def _decode(self, job: _Job, limit: int, stops: tuple[str, ...],
                      ignore_eos: bool) -> AsyncIterator[tuple[str, list[int], Any]]:
        """(new text, token ids so far, finish reason or None) as tokens come."""
        ids: list[int] = []
        sent = 0
        while (item := await job.queue.get()) is not None:
            if isinstance(item, BaseException):
                raise UpstreamError(f"transformers' generate() failed: {item!r}", kind="upstream_status") from item
            ids.extend(item)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            cut = min((at for at in (text.find(stop) for stop in stops) if at >= 0), default=None)
            if cut is not None:
                yield text[sent:cut], ids, "stop"
                return
            if text.endswith("\ufffd"):
                continue  # a character split across tokens: wait for the rest
            safe = len(text) - max((k for stop in stops for k in range(1, len(stop)) if text.endswith(stop[:k])),
                                   default=0)
            if safe > sent:
                yield text[sent:safe], ids, None
                sent = safe
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        reason = "length" if len(ids) >= limit and (ignore_eos or ids[-1] not in self._eos) else "stop"
        yield text[sent:], ids, reason

    def _submit(self, prompt: list[int], limit: int, spec: RequestSpec, seed: int | None) -> _Job:
        job = _Job(asyncio.get_running_loop())
        self._jobs.add(job)
        future = asyncio.get_running_loop().run_in_executor(self._worker, self._run, job, prompt, limit, spec, seed)
        future.add_done_callback(lambda _: self._jobs.discard(job))
        return job

    def _run(self, job: _Job, prompt: list[int], limit: int, spec: RequestSpec, seed: int | None) -> None:
        """On the worker thread: one generate() for one choice, unless it was cancelled while waiting."""
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList
        from transformers.generation.streamers import BaseStreamer

        class Streamer(BaseStreamer):
            prompt_seen = False

            def put(self, value: Any) -> None:
                if self.prompt_seen:
                    job.push(value.reshape(-1).tolist())
                self.prompt_seen = True

            def end(self) -> None:
                pass

        class Cancelled(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                return torch.full((input_ids.shape[0],), job.cancelled.is_set(), dtype=torch.bool)

        try:
            if job.cancelled.is_set():
                return
            s = spec.sampling
            sample = s.temperature > 0
            # generation parameters as keywords, not a GenerationConfig: there a None falls back to
            # the model's generation_config, which would put the end tokens back for ignore_eos
            # (vLLM's meaning: the end token may be chosen, and generation goes on after it)
            params = dict(
                max_new_tokens=limit, min_new_tokens=s.min_tokens or None,
                do_sample=sample,
                temperature=s.temperature if sample else None, top_p=s.top_p if sample else None,
                top_k=(s.top_k or 0) if sample else None, min_p=(s.min_p or None) if sample else None,
                repetition_penalty=s.repetition_penalty,
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                **({"eos_token_id": None} if s.ignore_eos else {}),
            )
            if seed is not None:
                torch.manual_seed(seed)
            input_ids = torch.tensor([prompt])
            with torch.inference_mode():
                self.model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                    streamer=Streamer(), stopping_criteria=StoppingCriteriaList([Cancelled()]),
                                    **params)
        except Exception as exc:  # noqa: BLE001 - handed to the request, which raises UpstreamError
            job.push(exc)
        finally:
            job.push(None)


@hookimpl
def switchyard_backend_types() -> list[BackendType]:
    return [BackendType(name="transformers", options=TransformersOptions, create=TransformersBackend,
                        description="Hugging Face transformers' generate() in process")]
