"""The shared core of every proxy backend (vLLM, llama.cpp, any OpenAI-compatible server).

The hop to the servers (replicas, connection pools, the three timeouts) is `plugins.proxy.upstream`;
a streamed answer read into events is `plugins.proxy.stream` (the incremental SSE parser,
`plugins.transport.sse`, and the mapping of upstream chunks to `plugins.contract.protocol` events,
`plugins.proxy.normalize`); upstream error bodies become `plugins.contract.errors` in
`plugins.proxy.errors`. The `vllm`, `llamacpp` and `openai_compatible` plugins subclass
`ProxyBackend` and override only what differs: the request body (`translate_*`), the catalogue,
tokenization.

Design points:
- Upstream requests always stream (`stream: true`, `stream_options.include_usage: true`) —
  also for a client's non-streaming request, which the gateway assembles from the events. So
  usage is always metered, the first-byte/idle timeouts mean the same for both kinds, and
  closing the event iterator (client gone) always closes the upstream connection, which is how
  vLLM and llama.cpp learn to abort the request. A plain JSON answer (a server that ignores
  `stream`) is accepted too.
- The client never sees an upstream's id, `created`, `model`, `system_fingerprint`, vLLM's
  `stop_reason`/`token_ids`, llama.cpp's `timings`, or the upstream role chunk (the gateway
  writes its own): only TextDelta / ToolCallDelta / Finish / Usage come out. Empty deltas are
  dropped. Tool calls come out in one shape whatever the upstream sent: a call's first delta
  carries its id and function name, later ones only argument text. `cached_tokens` comes from `usage.prompt_tokens_details.cached_tokens`, else from
  llama.cpp's `timings.cache_n`. The stop string that ended a choice (`Finish.stop_sequence`)
  comes from vLLM's `stop_reason` or llama.cpp's `__verbose.stopping_word`.
- Every sampling value is sent explicitly (the gateway fills OpenAI defaults into
  `RequestSpec.sampling`), so a server's own defaults (llama.cpp: temperature 0.8, top_k 40,
  top_p 0.95, min_p 0.05; vLLM: the model's generation_config) never apply.
- `api_key` goes only into this backend's upstream (`Authorization: Bearer`), is never logged,
  and is redacted from the options' repr; redirects are not followed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

from plugins.contract.errors import InvalidRequest, SwitchyardError
from plugins.contract.protocol import (
    Capabilities,
    EmbedRequest,
    EmbedResult,
    Event,
    ModelInfo,
    Rendered,
    RequestSpec,
    TokenizeRequest,
    TokenizeResult,
)
from plugins.contract.system_turns import system_messages_as
from plugins.fleet.fleet import Fleet
from plugins.fleet.replica import ReplicaStats
from plugins.parsers.reasoning import ReasoningSplitter, choose_parser, split_reasoning
from plugins.proxy.embeddings import embed_upstream
from plugins.proxy.options import ProxyOptions
from plugins.proxy.stream import UpstreamEvents
from plugins.proxy.upstream import Upstream, upstream_ids
from plugins.transport import http1

log = logging.getLogger("switchyard.proxy")


# ------------------------------------------------------------------------------------ backend


class ProxyBackend:
    """A backend that forwards to OpenAI-compatible HTTP servers: one, or a fleet of replicas
    (`plugins.fleet`). Subclasses set the class attributes and override `translate_chat` /
    `translate_completion` (the request body), `discover_models`, `tokenize`, `detokenize`,
    `render` where their server differs; `load_sources` names the engine's own load reports
    (`plugins.fleet.load_signals`) in the order to try them."""

    engine: ClassVar[str] = "openai-compatible"
    extensions: ClassVar[frozenset[str]] = frozenset()
    max_n: ClassVar[int | None] = None
    health_path: ClassVar[str] = "/health"
    max_tokens_field: ClassVar[str] = "max_tokens"
    load_sources: ClassVar[tuple[str, ...]] = ()
    honours_dimensions: ClassVar[bool] = True  # the upstream's /v1/embeddings takes `dimensions`

    def __init__(self, name: str, options: ProxyOptions) -> None:
        self.name = name
        self.options = options
        self._max_model_len: int | None = options.max_model_len
        self._model_lens: dict[str, int | None] = {}
        self.healthy: bool | None = None  # last probe's answer (None: not probed yet)
        self.launched: Any = None  # an engines.launch.ServerProcess when this backend started its server
        self._launched_url: str | None = None
        self.upstream = Upstream(name, options, load_sources=self.load_sources, health_path=self.health_path)

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return (self._launched_url or self.options.base_url).rstrip("/")

    @property
    def fleet(self) -> Fleet:
        """The upstream's replicas."""
        return self.upstream.fleet

    @property
    def client(self) -> http1.Pool | None:
        """The connection pool of a backend with exactly one replica (None for a fleet)."""
        replicas = list(self.fleet.replicas.values())
        return replicas[0].pool if len(replicas) == 1 else None

    async def launch(self) -> None:
        """Start the upstream server when the options ask for it (subclasses); set
        `self.launched` and `self._launched_url`."""

    async def start(self) -> None:
        if self.launched is None:
            await self.launch()
            if self._launched_url:
                self.fleet.update([self._launched_url])
        await self.fleet.start()
        try:
            await self.discover_models()
        except SwitchyardError as exc:
            log.warning("backend %s: upstream catalogue not available at start: %s", self.name, exc.message)

    async def close(self) -> None:
        await self.fleet.close()
        if self.launched is not None:
            server, self.launched = self.launched, None
            await asyncio.to_thread(server.stop)

    def load(self) -> float:
        """Requests per routable replica as the engines report them (`least_load` across a
        route's targets); inf when no replica can take a request."""
        return self.fleet.load()

    def replica_stats(self) -> list[ReplicaStats]:
        return self.fleet.stats()

    def in_flight(self) -> int:
        """Requests whose upstream response is still open (closing it is how the upstream learns
        to abort)."""
        return self.upstream.open_streams

    # -- capabilities, catalogue, health -----------------------------------------------------

    def capabilities(self) -> Capabilities:
        return Capabilities(
            extensions=self.extensions,
            reports_cached_tokens=True,
            max_model_len=self._max_model_len,
            max_n=self.max_n,
            supports_tools=self.supports_tools(),
            supports_response_format=self.supports_response_format(),
            supports_logprobs=True,
            supports_completions=True,
            supports_embeddings=self.options.embeddings,
        )

    def supports_tools(self) -> bool:
        return False

    def supports_response_format(self) -> bool:
        """JSON `response_format` (vLLM and llama.cpp honour it)."""
        return True

    def upstream_name(self, model: str) -> str:
        return self.options.models.get(model, model)

    async def discover_models(self) -> dict[str, int | None]:
        """The upstream's model names and their context lengths (GET /v1/models)."""
        body = await self.upstream.get_json("/v1/models")
        lens: dict[str, int | None] = {}
        for card in body.get("data") or ():
            if isinstance(card, dict) and isinstance(card.get("id"), str):
                mml = card.get("max_model_len")
                lens[card["id"]] = mml if isinstance(mml, int) else None
        self._set_model_lens(lens)
        return lens

    def _set_model_lens(self, lens: dict[str, int | None]) -> None:
        self._model_lens = lens
        if self.options.max_model_len is None:
            served = [self.upstream_name(m) for m in self.options.models] or list(lens)
            known = [lens[m] for m in served if lens.get(m)]
            self._max_model_len = min(known) if known else None  # type: ignore[type-var]

    async def models(self) -> list[ModelInfo]:
        try:
            lens = await self.discover_models()
        except SwitchyardError as exc:
            if not self.options.models:
                log.warning("backend %s: cannot list upstream models (%s) and `models` is not configured; "
                            "serving none until it answers", self.name, exc.message)
                return []
            lens = self._model_lens
        override = self.options.max_model_len
        if self.options.models:
            return [ModelInfo(id=public, max_model_len=override or lens.get(upstream), owned_by=self.name)
                    for public, upstream in self.options.models.items()]
        return [ModelInfo(id=model, max_model_len=override or mml, owned_by=self.name) for model, mml in lens.items()]

    async def health(self) -> bool:
        """Every replica probed (each feeds its own breaker); healthy while one can serve."""
        ok = await self.fleet.health()
        if not ok and not self.fleet.replicas and self.fleet.problem:
            log.warning("backend %s: unhealthy: %s", self.name, self.fleet.problem)
        self.healthy = ok
        return ok

    # -- generation ------------------------------------------------------------------------

    def build_body(self, spec: RequestSpec) -> dict[str, Any]:
        body = self.openai_body(spec)
        return self.translate_chat(body, spec) if spec.kind == "chat" else self.translate_completion(body, spec)

    def openai_body(self, spec: RequestSpec) -> dict[str, Any]:
        """The OpenAI-standard part of the upstream body; every sampling value explicit."""
        s = spec.sampling
        body: dict[str, Any] = {"model": self.upstream_name(spec.upstream_model)}
        if spec.kind == "chat":
            body["messages"] = system_messages_as(self.options.system_messages, spec.messages or [])
        else:
            body["prompt"] = spec.prompt
            if spec.echo:
                body["echo"] = True
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        body["n"] = s.n
        body["temperature"] = s.temperature
        body["top_p"] = s.top_p
        body["presence_penalty"] = s.presence_penalty
        body["frequency_penalty"] = s.frequency_penalty
        if s.max_tokens is not None:
            body[self.max_tokens_field if spec.kind == "chat" else "max_tokens"] = s.max_tokens
        if s.stop:
            body["stop"] = list(s.stop)
        if s.seed is not None:
            body["seed"] = s.seed
        if s.logit_bias:
            body["logit_bias"] = {str(k): v for k, v in s.logit_bias.items()}
        if s.logprobs:
            if spec.kind == "chat":
                body["logprobs"] = True
                if s.top_logprobs:
                    body["top_logprobs"] = s.top_logprobs
            else:
                body["logprobs"] = s.top_logprobs
        if spec.tools:
            body["tools"] = spec.tools
        if spec.tool_choice is not None:
            body["tool_choice"] = spec.tool_choice
        if spec.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = spec.parallel_tool_calls
        if spec.response_format is not None:
            body["response_format"] = spec.response_format
        if spec.user is not None:
            body["user"] = spec.user
        return body

    def translate_chat(self, body: dict[str, Any], spec: RequestSpec) -> dict[str, Any]:
        return body

    def content_calls(self, spec: RequestSpec) -> Callable[[], Any] | None:
        """When this backend enforces a request's tool_choice with a grammar of its own (the
        upstream answers in plain content), the factory of the parser that reads the content as
        tool calls; None when the upstream returns tool calls itself."""
        return None

    def translate_completion(self, body: dict[str, Any], spec: RequestSpec) -> dict[str, Any]:
        return body

    def request_headers(self, spec: RequestSpec) -> dict[str, str]:
        return {"content-type": "application/json", "accept": "text/event-stream",
                **upstream_ids(spec.request_id, spec.headers)}

    def generate(self, spec: RequestSpec) -> AsyncIterator[Event]:
        """`stream_upstream`, with `<think>` text split out of the content when the options say so."""
        factory = choose_parser(self.options.reasoning_parser, template_source=None, prompt_text=None,
                                chat_template_kwargs=spec.chat_template_kwargs) if spec.kind == "chat" else None
        events = self.stream_upstream(spec)
        if factory is None:
            return events
        return split_reasoning(events, ReasoningSplitter(factory))

    def stream_upstream(self, spec: RequestSpec) -> UpstreamEvents:
        """Stream one request upstream (`plugins.proxy.stream`). A failure before the first
        event is raised before any event (so the gateway still answers with a real status);
        closing it closes the upstream response, which cancels the request upstream."""
        return UpstreamEvents(self, spec)

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        return await embed_upstream(self.upstream, request, model=self.upstream_name(request.upstream_model),
                                    honours_dimensions=self.honours_dimensions)

    # -- tokens ------------------------------------------------------------------------------

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        raise InvalidRequest(f"Backend `{self.name}` does not offer tokenization.", param="model")

    async def detokenize(self, upstream_model: str, tokens: list[int]) -> str:
        raise InvalidRequest(f"Backend `{self.name}` does not offer detokenization.", param="model")

    async def render(self, upstream_model: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                     chat_template_kwargs: dict[str, Any] | None = None,
                     tools: list[dict[str, Any]] | None = None) -> Rendered:
        """The chat prompt exactly as this server builds it: text and token ids."""
        raise InvalidRequest(f"Backend `{self.name}` cannot show its rendered prompt.", param="model")
