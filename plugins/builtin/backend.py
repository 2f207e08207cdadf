"""The `builtin` backend: Switchyard's own engine (`builtin_engine`).

    [[backends]]
    name = "local"
    type = "builtin"
    [backends.options]
    model = "smollm2-135m-instruct"   # or a checkpoint directory

`generate(spec)`: render the chat template (or take the completion prompt), tokenize, submit to
the engine, and turn its per-step outputs into protocol events: `TextDelta`s per choice, one
`Finish` per choice, one `Usage`. System messages after the first are folded into the first
where the template refuses them there, or always (`system_messages = "fold"`;
`plugins.contract.system_turns`). Closing the event iterator aborts the request in the engine,
which frees its sequences and KV blocks before its next step.

Structured outputs (`structured_outputs`, JSON `response_format`) are compiled into a grammar
(`builtin_engine.text.structured`, cached, by the engine) before anything is scheduled, so a bad
schema is a 400. Tools go to the chat template's `tools` variable; with `tool_choice` "auto" the
output is read by the `tool_parser` (`plugins.parsers.tools`) into `ToolCallDelta`s and the
choice finishes with "tool_calls"; "required" and a named function are enforced with a grammar
(a list of calls, or the named function's arguments; a named call finishes with "stop", as in
vLLM). See `plugins.builtin.tools`.

`embed(request)` (/v1/embeddings) pools hidden states through the engine's `Embed` call; see
`plugins.builtin.embeddings`.

The engine runs in this process, or in an engine process of its own (`engine_process = true`,
and by default under `[server] workers` > 1, where one engine process serves every worker; see
`plugins.builtin.launch`): `builtin_engine.process.supervisor` starts and restarts it and
`builtin_engine.process.client` makes the same calls over ZeroMQ. This process keeps the text side
either way (chat template, tokenizer, tool parsing); the engine side compiles grammars,
schedules, samples and detokenizes.

Nothing heavy is imported here at module level: torch and `builtin_engine.engine` load in
`start()`, and only when the engine runs in this process.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from plugins.builtin.embeddings import Dimensions, allowed_dimensions
from plugins.builtin.embeddings import embed as embed_with_engine
from plugins.builtin.launch import engine_launch, load_engine, share_engine, start_engine_process
from plugins.builtin.options import BuiltinOptions, served_name
from plugins.builtin.tools import ToolPlan, finish_of, output_grammar, tool_events
from plugins.contract.config_types import BackendType
from plugins.contract.errors import (
    ConfigError,
    ContextLengthExceeded,
    InvalidRequest,
    ModelNotFound,
    Overloaded,
    UpstreamError,
)
from plugins.contract.hookspecs import hookimpl
from plugins.contract.system_turns import fold_system_messages, system_messages_as
from plugins.contract.protocol import (
    Capabilities,
    EmbedRequest,
    EmbedResult,
    Event,
    ModelInfo,
    Rendered,
    RequestSpec,
    TextDelta,
    TokenizeRequest,
    TokenizeResult,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from plugins.fleet.replica import ReplicaStats
from plugins.parsers.reasoning import ReasoningSplitter, choose_parser

if TYPE_CHECKING:
    from builtin_engine.outputs import ChoiceOutput, TokenLogprobs
    from builtin_engine.process.calls import EngineLaunch
    from builtin_engine.process.client import EngineClient
    from builtin_engine.process.service import EngineService
    from builtin_engine.process.supervisor import EngineSupervisor
    from builtin_engine.text.chat_template import ChatTemplate
    from builtin_engine.text.tokenizer import Tokenizer

EXTENSIONS = frozenset(
    {
        "top_k",
        "min_p",
        "repetition_penalty",
        "priority",
        "structured_outputs",
        "chat_template",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
        "include_stop_str_in_output",
        "skip_special_tokens",
        "min_tokens",
        "ignore_eos",
        "stop_token_ids",
        "continuous_usage_stats",
    }
)
_TEMPLATE_CACHE_SIZE = 16
_log = logging.getLogger("switchyard.builtin")


class BuiltinBackend:
    """A `plugins.contract.protocol.Backend` over the built-in engine, in this process or its own."""

    def __init__(self, name: str, options: BuiltinOptions) -> None:
        self.name = name
        self.options = options
        self.served_model_name = served_name(options)
        self.engine: EngineService | EngineClient | None = None  # the same calls either way
        self.supervisor: EngineSupervisor | None = None  # the engine process this backend started
        self.tokenizer: Tokenizer | None = None
        self.chat_template: ChatTemplate | None = None  # None: the model has none and no override
        self._chat_template_error: str | None = None
        self._templates: dict[str, ChatTemplate] = {}  # per-request overrides, compiled once
        self._token_text: dict[int, tuple[str, list[int]]] = {}
        self.matryoshka: Dimensions = None  # the `dimensions` embeddings allow

    # ---- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.engine is not None:
            return
        launch = await asyncio.to_thread(self._load_text_side)
        if self.options.engine_process or self.options.engine_address:
            self.engine = await self._connect_engine_process(launch)
        else:
            self.engine = await asyncio.to_thread(load_engine, self.name, launch)
        assert self.engine.info is not None
        _log.info("backend %r serves %s on %s", self.name, self.served_model_name, self.engine.info.placement)

    async def _connect_engine_process(self, launch: EngineLaunch) -> EngineClient:
        """A client of the engine process at `engine_address`, or of one started here."""
        from builtin_engine.process.client import EngineClient

        address = self.options.engine_address
        if address is None:
            self.supervisor = await asyncio.to_thread(start_engine_process, self.name, launch, self.options)
            address = self.supervisor.address
        client = EngineClient(address, name=self.name)
        try:
            await client.connect(self.options.engine_start_timeout_s)
        except BaseException:
            await self.close()
            raise
        return client

    def _load_text_side(self) -> EngineLaunch:
        """The tokenizer and chat template; returns what the engine is built from."""
        from builtin_engine.text.chat_template import ChatTemplate, ChatTemplateError
        from builtin_engine.text.tokenizer import Tokenizer, TokenizerError

        launch = engine_launch(self.name, self.options)
        where = f"backend {self.name!r}, [backends.options]"
        try:
            tokenizer = Tokenizer.from_dir(launch.model_dir)
        except TokenizerError as exc:
            raise ConfigError(f"{where} model: {exc}") from exc
        try:
            self.chat_template = ChatTemplate.from_dir(Path(launch.model_dir), override=self.options.chat_template)
        except ChatTemplateError as exc:
            if self.options.chat_template is not None:
                raise ConfigError(f"{where} chat_template: {exc}") from exc
            self._chat_template_error = str(exc)  # completions still work; chat requests get a 400
        self.tokenizer = tokenizer
        self.matryoshka = allowed_dimensions(Path(launch.model_dir), self.options.embeddings)
        return launch

    async def close(self) -> None:
        engine, self.engine = self.engine, None
        supervisor, self.supervisor = self.supervisor, None
        if engine is not None:
            await engine.close()
        if supervisor is not None:
            await asyncio.to_thread(supervisor.close)

    async def health(self) -> bool:
        return self.engine is not None and await self.engine.health()

    # ---- load: the scheduler's own state (in process: read directly; in an engine process: as of
    # the last health probe, and never below this worker's own open calls) ----------------------

    def load(self) -> float:
        """Requests running or waiting in the engine (`least_load` across a route's targets)."""
        return float(self.engine.num_unfinished()) if self.engine is not None else float("inf")

    def max_running(self) -> int:
        """Sequences the engine batches at once (`max_num_seqs`): its slots for flow control."""
        return self.options.max_num_seqs

    def replica_stats(self) -> list[ReplicaStats]:
        """The engine as a fleet of one (replica `local`), for the `switchyard_replica_*` gauges."""
        engine = self.engine
        if engine is None:
            return []
        stats, unfinished = engine.snapshot(), engine.num_unfinished()
        running = float(stats.num_running_seqs) if stats is not None else None
        return [ReplicaStats(
            backend=self.name, replica="local", draining=False, in_flight=unfinished, circuit=0,
            healthy=stats.alive if stats is not None else None, attempts={}, routed={}, load=float(unfinished),
            stale=stats is None, signal_age_s=0.0 if stats is not None else None, running=running,
            waiting=float(max(0, unfinished - running)) if running is not None else None,
            kv_cache_usage=1.0 - stats.num_free_blocks / stats.num_blocks if stats is not None else None,
            prefix_queried_tokens=None, prefix_hit_tokens=None, cached_blocks=0,
        )]

    def in_flight(self) -> int:
        """Requests the engine still holds (queued or running, sequences and KV blocks not freed)."""
        return self.engine.in_flight() if self.engine is not None else 0

    # ---- description ----------------------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        return Capabilities(
            extensions=EXTENSIONS,
            reports_cached_tokens=True,
            max_model_len=self.engine.max_model_len if self.engine is not None else self.options.max_model_len,
            supports_tools=self.options.tool_parser != "none",
            supports_response_format=True,
            supports_logprobs=True,
            supports_completions=True,
            supports_embeddings=True,
        )

    async def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=self.served_model_name, max_model_len=self.capabilities().max_model_len)]

    # ---- generation -----------------------------------------------------------------------------

    async def generate(self, spec: RequestSpec) -> AsyncIterator[Event]:  # type: ignore[override]
        from builtin_engine.errors import EngineError
        from builtin_engine.process.calls import Generate

        engine = self._require_engine(spec.upstream_model)
        tools = ToolPlan.of(spec, self._tool_parser_name(spec))
        try:
            prompt_ids, prompt_text = self._prompt_ids(spec)
            call = Generate(request_id=f"{spec.request_id}-{uuid.uuid4().hex[:8]}", prompt_ids=prompt_ids,
                            sampling=_sampling_fields(spec), grammar=output_grammar(spec, tools), priority=spec.priority)
        except EngineError as exc:
            raise _map_engine_error(exc, spec) from exc
        n, want_logprobs = spec.sampling.n, spec.sampling.logprobs
        reasoning = self._reasoning_splitter(spec, prompt_text)
        outputs = engine.generate(call)
        try:
            first = await anext(outputs, None)  # errors before scheduling come first, before any event
            if spec.continuous_usage_stats:
                yield Usage(prompt_tokens=len(prompt_ids), completion_tokens=0)
            if spec.echo and spec.kind == "completion":
                prompt = spec.prompt if isinstance(spec.prompt, str) else self._decode(prompt_ids, False)
                for index in range(n):
                    yield TextDelta(text=prompt, index=index)
            pending: dict[int, list[int]] = {}  # choice -> token ids not yet sent (held-back text)
            parsers = [tools.new_parser() for _ in range(n)] if tools is not None else None
            output = first
            while output is not None:
                events: list[Event] = []
                for choice in output.choices:
                    if parsers is not None:
                        token_ids = pending.setdefault(choice.index, [])
                        token_ids.extend(choice.token_ids)
                        logprobs = self._logprobs(choice) if want_logprobs else None
                        events += tool_events(choice, token_ids, logprobs, parsers[choice.index])
                        continue
                    event = self._text_event(choice, pending, want_logprobs=want_logprobs)
                    if event is not None:
                        events.append(event)
                    if choice.finish_reason is not None:
                        events.append(finish_of(choice, choice.finish_reason))
                if output.finished or spec.continuous_usage_stats:
                    events.append(Usage(prompt_tokens=output.num_prompt_tokens, completion_tokens=output.num_output_tokens,
                                        cached_tokens=output.num_cached_tokens))
                for event in events:
                    if reasoning is None:
                        yield event
                    else:
                        for piece in reasoning.feed(event):
                            yield piece
                output = await anext(outputs, None)
        except EngineError as exc:
            raise _map_engine_error(exc, spec) from exc
        finally:
            await outputs.aclose()  # type: ignore[attr-defined]  # aborts the request if it had not finished

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        engine = self._require_engine(request.upstream_model)
        assert self.tokenizer is not None
        return await embed_with_engine(engine, self.tokenizer, request, options=self.options.embeddings,
                                       allowed=self.matryoshka, model=self.served_model_name)

    def _reasoning_splitter(self, spec: RequestSpec, prompt_text: str | None) -> ReasoningSplitter | None:
        if spec.kind != "chat":
            return None
        template = self.chat_template if spec.chat_template is None else self._templates.get(spec.chat_template)
        factory = choose_parser(self.options.reasoning_parser, template_source=template.source if template else None,
                                prompt_text=prompt_text, chat_template_kwargs=spec.chat_template_kwargs)
        return None if factory is None else ReasoningSplitter(factory)

    def _text_event(self, choice: ChoiceOutput, pending: dict[int, list[int]], *,
                    want_logprobs: bool) -> TextDelta | None:
        """A TextDelta for the choice's news, or None when its text is held back and no logprobs
        ride (its token ids then go with the next delta)."""
        token_ids = pending.setdefault(choice.index, [])
        token_ids.extend(choice.token_ids)
        logprobs = self._logprobs(choice) if want_logprobs else None
        if not choice.text and not logprobs:
            return None
        pending[choice.index] = []
        return TextDelta(text=choice.text, index=choice.index, token_ids=tuple(token_ids), logprobs=logprobs)

    def _logprobs(self, choice: ChoiceOutput) -> list[TokenLogprob] | None:
        return [self._logprob(lp) for lp in choice.logprobs] if choice.logprobs else None

    def _logprob(self, lp: TokenLogprobs) -> TokenLogprob:
        token, data = self._token_repr(lp.token_id)
        top = []
        for token_id, logprob in lp.top:
            top_token, top_data = self._token_repr(token_id)
            top.append(TopLogprob(token=top_token, logprob=logprob, bytes=top_data))
        return TokenLogprob(token=token, logprob=lp.logprob, bytes=data, top_logprobs=top)

    def _token_repr(self, token_id: int) -> tuple[str, list[int]]:
        """A token's text for logprobs (its bytes decoded, U+FFFD for a partial character) and bytes."""
        cached = self._token_text.get(token_id)
        if cached is None:
            assert self.tokenizer is not None
            data = self.tokenizer.token_bytes(token_id)
            cached = (data.decode("utf-8", errors="replace"), list(data))
            self._token_text[token_id] = cached
        return cached

    # ---- structured outputs and tools -----------------------------------------------------------

    def _tool_parser_name(self, spec: RequestSpec) -> str:
        from plugins.parsers.tools import detect_parser

        name = self.options.tool_parser
        if name != "auto" or not spec.tools:
            return name
        template = self.chat_template
        if spec.chat_template is not None:
            try:
                template = self._template(spec.chat_template)
            except Exception:  # noqa: BLE001 - rendering the prompt reports a bad template
                template = self.chat_template
        return detect_parser(template.source if template is not None else None)

    # ---- prompts --------------------------------------------------------------------------------

    def _prompt_ids(self, spec: RequestSpec) -> tuple[list[int], str | None]:
        """The prompt's token ids, and its text when a chat template rendered it."""
        assert self.tokenizer is not None
        if spec.messages is not None:
            text = self._render(spec.messages, chat_template=spec.chat_template,
                                add_generation_prompt=spec.add_generation_prompt,
                                continue_final_message=spec.continue_final_message, tools=spec.tools,
                                chat_template_kwargs=spec.chat_template_kwargs)
            return self.tokenizer.encode(text, add_special_tokens=False), text
        if isinstance(spec.prompt, str):
            return self.tokenizer.encode(spec.prompt, add_special_tokens=True), None
        if isinstance(spec.prompt, list):
            return list(spec.prompt), None
        raise InvalidRequest("Either messages or prompt is required.", param="messages")

    def _render(self, messages: list[dict[str, Any]], *, chat_template: str | None, add_generation_prompt: bool,
                continue_final_message: bool, tools: list[dict[str, Any]] | None,
                chat_template_kwargs: dict[str, Any] | None) -> str:
        from builtin_engine.text.chat_template import ChatTemplateError

        try:
            template = self._template(chat_template)
            render = partial(template.render, add_generation_prompt=add_generation_prompt,
                             continue_final_message=continue_final_message, tools=tools,
                             chat_template_kwargs=chat_template_kwargs)
            messages = system_messages_as(self.options.system_messages, messages)
            try:
                return render(messages)
            except ChatTemplateError as refused:
                folded = fold_system_messages(messages)  # system turns where the template takes none
                if folded is None:
                    raise
                try:
                    return render(folded)
                except ChatTemplateError:
                    raise refused from None
        except ChatTemplateError as exc:
            raise InvalidRequest(str(exc), param="chat_template" if chat_template else "messages") from exc

    def _template(self, override: str | None) -> ChatTemplate:
        from builtin_engine.text.chat_template import ChatTemplate, ChatTemplateError

        if override is None:
            if self.chat_template is None:
                raise ChatTemplateError(self._chat_template_error or "the model has no chat template")
            return self.chat_template
        template = self._templates.get(override)
        if template is None:
            assert self.tokenizer is not None
            template = ChatTemplate(override, special_tokens=self.tokenizer.special_tokens_map,
                                    model_name=self.served_model_name)
            if len(self._templates) >= _TEMPLATE_CACHE_SIZE:
                self._templates.pop(next(iter(self._templates)))
            self._templates[override] = template
        return template

    # ---- tokenize / detokenize ------------------------------------------------------------------

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        """vLLM's /tokenize. With `messages` the chat template is rendered and its text encoded
        without adding special tokens again (as `generate` does, so the count equals a chat
        request's `prompt_tokens`); a `prompt` is encoded with `add_special_tokens`."""
        self._require_engine(request.upstream_model)
        assert self.tokenizer is not None and self.engine is not None
        if request.messages is not None:
            text = self._render(request.messages, chat_template=request.chat_template,
                                add_generation_prompt=request.add_generation_prompt,
                                continue_final_message=request.continue_final_message, tools=request.tools,
                                chat_template_kwargs=request.chat_template_kwargs)
            tokens = self.tokenizer.encode(text, add_special_tokens=False)
        elif request.prompt is not None:
            tokens = self.tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens)
        else:
            raise InvalidRequest("Either prompt or messages is required.", param="prompt")
        strs = None
        if request.return_token_strs:
            strs = [self.tokenizer.id_to_token(t) or "" for t in tokens]
        return TokenizeResult(tokens=tokens, max_model_len=self.engine.max_model_len, token_strs=strs)

    async def render(self, upstream_model: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                     chat_template_kwargs: dict[str, Any] | None = None,
                     tools: list[dict[str, Any]] | None = None) -> Rendered:
        """The prompt text this engine builds for `messages` and its token ids (template inspector)."""
        self._require_engine(upstream_model)
        assert self.tokenizer is not None
        text = self._render(messages, chat_template=None, add_generation_prompt=add_generation_prompt,
                            continue_final_message=False, tools=tools, chat_template_kwargs=chat_template_kwargs)
        tokens = self.tokenizer.encode(text, add_special_tokens=False)
        return Rendered(text=text, tokens=tokens, token_strs=[self.tokenizer.id_to_token(t) or "" for t in tokens])

    async def detokenize(self, upstream_model: str, tokens: list[int]) -> str:
        self._require_engine(upstream_model)
        assert self.tokenizer is not None
        if any(not 0 <= t < self.tokenizer.vocab_size for t in tokens):
            raise InvalidRequest(f"token ids must be in [0, {self.tokenizer.vocab_size})", param="tokens")
        return self._decode(tokens, False)

    def _decode(self, tokens: list[int], skip_special_tokens: bool) -> str:
        assert self.tokenizer is not None
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    def _require_engine(self, upstream_model: str) -> EngineService | EngineClient:
        if upstream_model != self.served_model_name:
            raise ModelNotFound(upstream_model)
        if self.engine is None:
            raise UpstreamError(f"backend {self.name!r} is not started", kind="unavailable")
        return self.engine


def _sampling_fields(spec: RequestSpec) -> dict[str, Any]:
    """The request's sampling parameters as the engine takes them (a test checks that the engine
    knows every protocol field)."""
    from builtin_engine.process.calls import SAMPLING_FIELDS

    return {k: v for k, v in msgspec.structs.asdict(spec.sampling).items() if k in SAMPLING_FIELDS}


def _map_engine_error(exc: BaseException, spec: RequestSpec) -> Exception:
    from builtin_engine import errors as e

    if isinstance(exc, e.ContextLengthExceeded):
        param = "max_tokens" if exc.param == "max_tokens" else ("messages" if spec.kind == "chat" else "prompt")
        return ContextLengthExceeded(str(exc), param=param, prompt_tokens=exc.num_prompt_tokens,
                                     max_model_len=exc.max_model_len, max_tokens=exc.max_tokens)
    if isinstance(exc, e.InvalidRequestError):
        return InvalidRequest(str(exc), param=exc.param)
    if isinstance(exc, e.QueueFull):
        return Overloaded(str(exc), retry_after_s=1.0)
    return UpstreamError(str(exc), kind="unavailable")


@hookimpl
def switchyard_backend_types() -> list[BackendType]:
    return [
        BackendType(
            name="builtin",
            options=BuiltinOptions,
            create=BuiltinBackend,
            share=share_engine,
            description="Switchyard's own engine (Llama-family checkpoints on CPU or CUDA), in process or its own.",
        )
    ]
