"""The shared core of every proxy backend (vLLM, llama.cpp, any OpenAI-compatible server).

One `plugins.http1.Pool` per backend (keep-alive connections), three separate timeouts
(connect; first byte: from sending the request until the first body bytes; idle: between two
body pieces), the incremental SSE parser (`plugins.sse_parser`), the mapping of upstream chunks
to `plugins.protocol` events, and the mapping of upstream error bodies to `plugins.errors`,
done once here. The `vllm`, `llamacpp` and `openai_compatible` plugins subclass `ProxyBackend`
and override only what differs: the request body (`translate_*`), the catalogue, tokenization.

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
- `api_key` goes only into this backend's client (`Authorization: Bearer`), is never logged,
  and is redacted from the options' repr; redirects are not followed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta

from plugins import http1
from plugins.errors import (
    ConfigError,
    ContextLengthExceeded,
    InvalidRequest,
    ModelNotFound,
    NotFound,
    RequestTooLarge,
    SwitchyardError,
    UpstreamError,
)
from plugins.fleet.fleet import Fleet
from plugins.fleet.options import (
    BalanceName,
    DiscoveryOptions,
    LoadSignalOptions,
    PrefixCacheOptions,
    ReplicaBreakerOptions,
)
from plugins.fleet.replica import Replica, ReplicaStats
from plugins.protocol import (
    EXTENSIONS,
    Capabilities,
    EmbedRequest,
    EmbedResult,
    Event,
    Finish,
    ModelInfo,
    ReasoningDelta,
    Rendered,
    RequestSpec,
    TextDelta,
    TokenizeRequest,
    TokenizeResult,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from plugins.proxy_embeddings import embed_upstream
from plugins.reasoning import ReasoningSplitter, choose_parser, split_reasoning
from plugins.sse_parser import SSEParser

log = logging.getLogger("switchyard.proxy")

MAX_ERROR_BODY = 1 << 20  # bytes of an upstream error body read before giving up on the rest
TRACE_HEADERS = ("traceparent", "tracestate")  # sent on to the upstream when spec.headers has them

_json_decode = msgspec.json.Decoder().decode
_json_encode = msgspec.json.Encoder().encode


# ------------------------------------------------------------------------------------ options


class TimeoutOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Seconds. `first_byte_s` runs from sending the request to the first body bytes (covers
    queueing and prefill); `idle_s` is the longest silence allowed between two body pieces."""

    connect_s: float = 5.0
    first_byte_s: float = 120.0
    idle_s: float = 60.0
    health_s: float = 2.0  # one /health probe


class PoolOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    max_connections: int = 256  # requests in flight to this upstream at once
    max_keepalive_connections: int = 256  # idle connections kept for reuse
    # below the servers' own idle keep-alive timeout (uvicorn, hence vLLM: 5 s; llama-server's
    # cpp-httplib: 5 s), so a pooled connection is dropped by us before the server drops it
    keepalive_expiry_s: float = 4.0
    acquire_timeout_s: float = 10.0  # waiting for a free pooled connection


class ProxyOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Options every proxy backend shares (`[backends.options]` in plugins.toml).

    - `base_url`: the upstream server, without `/v1` (e.g. "http://127.0.0.1:8001").
    - `endpoints` (instead of `base_url`): the base URLs of several replicas of one server;
      `discovery` (instead of both): a `dns` name or a `file` that lists them as they change.
      `balance` picks a replica per request, `replica_attempts` bounds the replicas one request
      may try before its first byte, `replica_breaker` is each replica's circuit breaker,
      `load_signals` the scrape of each engine's load, `prefix_cache` the prefix index
      (`plugins.fleet`; README "Fronting a fleet").
    - `api_key` / `api_key_env`: sent as `Authorization: Bearer` to this upstream only; prefer
      `api_key_env` (the name of an environment variable) over a key written in the file.
    - `models`: the gateway's model names → the upstream's names. Empty: serve every model the
      upstream lists, under its own name. Non-empty: serve exactly these names.
    - `max_model_len`: overrides what the upstream reports.
    - `headers`: extra headers sent upstream with every request.
    - `embeddings`: the upstream serves `/v1/embeddings` (see `plugins.proxy_embeddings`).
    """

    base_url: str = ""
    endpoints: list[str] | None = None
    discovery: DiscoveryOptions | None = None
    balance: BalanceName = "prefix_cache"
    replica_attempts: Annotated[int, Meta(ge=1)] = 3
    replica_breaker: ReplicaBreakerOptions = ReplicaBreakerOptions()
    load_signals: LoadSignalOptions = LoadSignalOptions()
    prefix_cache: PrefixCacheOptions = PrefixCacheOptions()
    api_key: str | None = None
    api_key_env: str | None = None
    models: dict[str, str] = {}
    max_model_len: int | None = None
    timeouts: TimeoutOptions = TimeoutOptions()
    pool: PoolOptions = PoolOptions()
    headers: dict[str, str] = {}
    embeddings: bool = False
    # also split `<think>` text out of the upstream's content (for a server that does not do
    # it itself); the upstream's own `reasoning` / `reasoning_content` fields are always read
    reasoning_parser: Literal["none", "deepseek_r1"] = "none"

    def __repr__(self) -> str:  # never show a key
        fields = []
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if name == "api_key" and value is not None:
                value = "***"
            fields.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(fields)})"


# ----------------------------------------------------------------------------- error mapping

_OVERFLOW = re.compile(
    r"maximum context length|context length|exceeds the available context size|context size|max_model_len"
    r"|context window|too many tokens|prompt is too long",
    re.IGNORECASE,
)
_OUTPUT_PARAMS = frozenset({"max_tokens", "max_completion_tokens", "n_predict"})


def _error_fields(payload: Any) -> tuple[str, str | None, str | None]:
    """(message, type, param) from an upstream error body, whatever its shape: OpenAI/vLLM/
    llama.cpp `{"error": {...}}`, vLLM's 401 `{"error": "Unauthorized"}`, FastAPI's
    `{"detail": ...}`, or plain text."""
    if isinstance(payload, dict):
        err = payload.get("error", payload)
        if isinstance(err, str):
            return err, None, None
        if isinstance(err, dict):
            message = err.get("message") or err.get("detail") or err.get("msg")
            if not isinstance(message, str):
                message = _json_encode(err).decode() if message is None else str(message)
            etype = err.get("type")
            param = err.get("param")
            return message, etype if isinstance(etype, str) else None, param if isinstance(param, str) else None
    if isinstance(payload, str):
        return payload, None, None
    return _json_encode(payload).decode(), None, None


def _clean_param(param: str | None) -> str | None:
    if not param:
        return None
    return param.removeprefix("body.")


def map_upstream_error(status: int, payload: Any, *, backend: str, spec: RequestSpec | None = None) -> SwitchyardError:
    """The one mapping of an upstream error (HTTP status + parsed body) onto the gateway's
    typed errors. The upstream's message is kept as it is."""
    message, etype, param = _error_fields(payload)
    message = message.strip() or f"Backend `{backend}` answered HTTP {status}."
    param = _clean_param(param)
    if etype == "exceed_context_size_error" or (400 <= status < 500 and status != 429 and _OVERFLOW.search(message)):
        if param in _OUTPUT_PARAMS:
            where = "max_tokens"
        else:
            where = "prompt" if spec is not None and spec.kind == "completion" else "messages"
        return ContextLengthExceeded(message, param=where)
    if status == 429:
        return UpstreamError(message, kind="rate_limited", upstream_status=429)
    if status in (401, 403):
        # the gateway's own credentials for this upstream are wrong: never the client's fault
        return UpstreamError(f"Backend `{backend}` refused the gateway's credentials: {message}", kind="bad_gateway",
                             upstream_status=status)
    if status == 404:
        if spec is not None and (param == "model" or etype == "NotFoundError"):
            return ModelNotFound(spec.model)
        return NotFound(message)
    if status == 413:
        return RequestTooLarge(message)
    if 400 <= status < 500:
        return InvalidRequest(message, param=param)
    if status == 503:
        return UpstreamError(message, kind="unavailable", upstream_status=503)
    if status >= 500:
        return UpstreamError(message, kind="upstream_status", upstream_status=status)
    return UpstreamError(f"Backend `{backend}` answered HTTP {status}: {message}", kind="bad_gateway",
                         upstream_status=status)


def error_from_body(status: int, body: bytes, *, backend: str, spec: RequestSpec | None = None) -> SwitchyardError:
    try:
        payload: Any = _json_decode(body) if body else ""
    except msgspec.DecodeError:
        payload = body[:2000].decode("utf-8", errors="replace")
    return map_upstream_error(status, payload, backend=backend, spec=spec)


def _status_of_error_event(payload: dict) -> int:
    err = payload.get("error")
    code = err.get("code") if isinstance(err, dict) else None
    if isinstance(code, int) and 400 <= code < 600:
        return code
    if isinstance(code, str) and code.isdigit():
        return int(code)
    return 500


# ------------------------------------------------------------------------------- normalizer

_FINISH = {
    "stop": "stop",
    "eos": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "stop",  # not in protocol.FinishReason (yet)
}


def _logprobs(raw: Any) -> list[TokenLogprob] | None:
    """Chat `{"content": [...]}` items (llama.cpp's extra `id` dropped) or legacy completions'
    `{"tokens", "token_logprobs", "top_logprobs"}` → TokenLogprob list."""
    if not isinstance(raw, dict):
        return None
    content = raw.get("content")
    if isinstance(content, list):
        out = []
        for item in content:
            top = [
                TopLogprob(token=t.get("token", ""), logprob=float(t.get("logprob", 0.0)), bytes=t.get("bytes"))
                for t in item.get("top_logprobs") or ()
            ]
            out.append(TokenLogprob(token=item.get("token", ""), logprob=float(item.get("logprob", 0.0)),
                                    bytes=item.get("bytes"), top_logprobs=top))
        return out or None
    tokens = raw.get("tokens")
    if isinstance(tokens, list):
        lps = raw.get("token_logprobs") or []
        tops = raw.get("top_logprobs") or []
        out = []
        for i, token in enumerate(tokens):
            lp = lps[i] if i < len(lps) and lps[i] is not None else 0.0
            top_map = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
            top = [TopLogprob(token=k, logprob=float(v)) for k, v in top_map.items()]
            out.append(TokenLogprob(token=token, logprob=float(lp), bytes=list(token.encode()), top_logprobs=top))
        return out or None
    return None


def _stop_string(choice: dict, chunk: dict) -> str | None:
    """The stop string that ended a choice: vLLM's `stop_reason` (a string; a stop token id is
    an int), or llama.cpp's `__verbose.stopping_word` (sent when the request has `verbose`)."""
    matched = choice.get("stop_reason")
    if isinstance(matched, str) and matched:
        return matched
    verbose = chunk.get("__verbose")
    if isinstance(verbose, dict) and verbose.get("stop_type") == "word":
        word = verbose.get("stopping_word")
        return word if isinstance(word, str) and word else None
    return None


def usage_from(raw: dict, timings: Any = None) -> Usage:
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None and isinstance(timings, dict) and isinstance(timings.get("cache_n"), int):
        cached = timings["cache_n"]  # llama.cpp builds without prompt_tokens_details
    completion = raw.get("completion_tokens_details")
    reasoning = completion.get("reasoning_tokens") if isinstance(completion, dict) else None
    return Usage(
        prompt_tokens=int(raw.get("prompt_tokens") or 0),
        completion_tokens=int(raw.get("completion_tokens") or 0),
        cached_tokens=None if cached is None else int(cached),
        reasoning_tokens=int(reasoning) if isinstance(reasoning, int) else None,
    )


class StreamNormalizer:
    """Upstream chunks (`chat.completion.chunk` / `text_completion`, one SSE `data` each) →
    protocol events. Text with a `finish_reason` in the same chunk comes out as TextDelta then
    Finish; empty deltas are dropped; the usage (whichever chunk carries it: vLLM's and
    llama.cpp's `choices: []` chunk, llama.cpp's last /v1/completions chunk) comes out once, by
    `finish()`, after the stream ended."""

    def __init__(self, *, kind: str, n: int, backend: str, spec: RequestSpec | None = None,
                 content_calls: Callable[[], Any] | None = None) -> None:
        """`content_calls`: for a tool_choice the gateway enforced itself with a grammar, a
        factory of the `builtin_engine.tool_parsers` parser that reads the upstream's content
        as tool calls (one per choice)."""
        self.chat = kind == "chat"
        self.n = n
        self.backend = backend
        self.spec = spec
        self.finished: set[int] = set()
        self.usage: Usage | None = None
        self.done = False  # `data: [DONE]` seen
        self.tool_named: dict[tuple[int, int], bool] = {}  # (choice, tool index) -> its name went out
        self.content_calls = content_calls
        self.content_parsers: dict[int, Any] = {}

    def feed_data(self, data: str) -> list[Event]:
        if data == "[DONE]":
            self.done = True
            return []
        try:
            obj = _json_decode(data)
        except msgspec.DecodeError:
            raise UpstreamError(f"Backend `{self.backend}` sent an event that is not JSON: {data[:200]!r}",
                                kind="bad_gateway") from None
        if not isinstance(obj, dict):
            raise UpstreamError(f"Backend `{self.backend}` sent an unexpected event: {data[:200]!r}", kind="bad_gateway")
        return self.feed(obj)

    def feed(self, obj: dict) -> list[Event]:
        """One chunk's events. A chunk of the wrong shape (`choices` not a list of objects, a
        token count that is not a number...) is the upstream's fault like bad JSON is: an
        `UpstreamError`, never a TypeError escaping as a 500 or cutting a stream short."""
        try:
            return self._feed(obj)
        except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise UpstreamError(f"Backend `{self.backend}` sent a chunk of an unexpected shape "
                                f"({type(exc).__name__}: {exc}).", kind="bad_gateway") from None

    def _feed(self, obj: dict) -> list[Event]:
        if "error" in obj and not obj.get("choices"):
            raise map_upstream_error(_status_of_error_event(obj), obj, backend=self.backend, spec=self.spec)
        events: list[Event] = []
        for choice in obj.get("choices") or ():
            index = choice.get("index", 0)
            if not isinstance(index, int) or index in self.finished:
                continue
            if index >= self.n:
                raise UpstreamError(f"Backend `{self.backend}` sent choice {index} of {self.n}.", kind="bad_gateway")
            if self.chat:
                delta = choice.get("delta") or choice.get("message") or {}
                text = delta.get("content")
                # vLLM >= 0.10 names it `reasoning`; llama.cpp, DeepSeek and older vLLM `reasoning_content`
                reasoning = delta.get("reasoning") or delta.get("reasoning_content")
                if isinstance(reasoning, str) and reasoning:
                    events.append(ReasoningDelta(text=reasoning, index=index))
                events += self._tool_calls(index, delta.get("tool_calls"))
            else:
                text = choice.get("text")
            logprobs = _logprobs(choice.get("logprobs"))
            reason = choice.get("finish_reason")
            if self.chat and self.content_calls is not None:
                text = self._content_calls(index, text or "", events, ended=bool(reason))
            if text or logprobs:
                events.append(TextDelta(text=text or "", index=index, logprobs=logprobs))
            if reason:
                reason = self._reason(reason)
                parser = self.content_parsers.get(index)
                if reason == "stop" and parser is not None and parser.num_calls and parser.calls_finish_as_tool_calls:
                    reason = "tool_calls"
                stop_sequence = _stop_string(choice, obj) if reason == "stop" else None
                events.append(Finish(reason=reason, index=index, stop_sequence=stop_sequence))  # type: ignore[arg-type]
                self.finished.add(index)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage_from(usage, obj.get("timings"))
            if self.spec is not None and self.spec.continuous_usage_stats:
                events.append(self.usage)
        return events

    def _content_calls(self, index: int, text: str, events: list[Event], *, ended: bool) -> str:
        """Content read as tool calls (`content_calls`): the calls go into `events`; what is
        left as content is returned."""
        parser = self.content_parsers.get(index)
        if parser is None:
            assert self.content_calls is not None
            parser = self.content_parsers[index] = self.content_calls()
        pieces = (parser.feed(text) if text else []) + (parser.finish() if ended else [])
        content = []
        for piece in pieces:
            if isinstance(piece, str):
                content.append(piece)
            else:
                events.append(ToolCallDelta(tool_index=piece.tool_index, arguments=piece.arguments, id=piece.id,
                                            name=piece.name, index=index))
        return "".join(content)

    def _tool_calls(self, index: int, calls: Any) -> list[ToolCallDelta]:
        """Upstream tool-call deltas in one shape: a call's first delta carries its id (made up
        when the upstream sent none) and function name, later ones only argument text (ids and
        names an upstream repeats are dropped). A whole message's calls have no `index`: their
        position is it."""
        out: list[ToolCallDelta] = []
        for position, call in enumerate(calls if isinstance(calls, list) else ()):
            if not isinstance(call, dict):
                continue
            tool_index = call.get("index")
            tool_index = tool_index if isinstance(tool_index, int) else position
            fn = call.get("function") if isinstance(call.get("function"), dict) else {}
            args = fn.get("arguments")
            if args is not None and not isinstance(args, str):  # an object instead of its JSON text
                args = _json_encode(args).decode()
            name = fn.get("name") if isinstance(fn.get("name"), str) else None
            key = (index, tool_index)
            if key not in self.tool_named:
                self.tool_named[key] = bool(name)
                call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else None
                out.append(ToolCallDelta(tool_index=tool_index, arguments=args or "",
                                         id=call_id or f"call_{uuid.uuid4().hex[:24]}", name=name or None, index=index))
            elif args or (name and not self.tool_named[key]):
                send_name = name if name and not self.tool_named[key] else None
                self.tool_named[key] = self.tool_named[key] or bool(name)
                out.append(ToolCallDelta(tool_index=tool_index, arguments=args or "", name=send_name, index=index))
        return out

    def feed_response(self, obj: dict) -> list[Event]:
        """A whole non-streamed `chat.completion` / `text_completion` object (`message` is
        read like a delta)."""
        return self.feed(obj)

    def _reason(self, reason: str) -> str:
        if reason in ("abort", "error"):
            raise UpstreamError(f"Backend `{self.backend}` ended the generation with finish_reason {reason!r}.",
                                kind="bad_gateway")
        return _FINISH.get(reason, "stop")

    def finish(self) -> Usage:
        missing = set(range(self.n)) - self.finished
        if missing:
            raise UpstreamError(f"Backend `{self.backend}` ended the stream before choice {min(missing)} finished.",
                                kind="bad_gateway")
        if self.usage is None:
            raise UpstreamError(f"Backend `{self.backend}` sent no usage although it was asked for "
                                "(`stream_options.include_usage`).", kind="bad_gateway")
        return self.usage


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
        self.fleet = Fleet.from_options(name, options, make_pool=self._make_pool, load_sources=self.load_sources,
                                        health_path=self.health_path)
        self._open_streams = 0  # upstream responses generate() holds open

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return (self._launched_url or self.options.base_url).rstrip("/")

    @property
    def client(self) -> http1.Pool | None:
        """The connection pool of a backend with exactly one replica (None for a fleet)."""
        replicas = list(self.fleet.replicas.values())
        return replicas[0].pool if len(replicas) == 1 else None

    def _api_key(self) -> str | None:
        if self.options.api_key:
            return self.options.api_key
        if self.options.api_key_env:
            return os.environ.get(self.options.api_key_env) or None
        return None

    def _make_pool(self, url: str) -> http1.Pool:
        t, p = self.options.timeouts, self.options.pool
        headers = {"accept-encoding": "identity", "user-agent": "switchyard-proxy", **self.options.headers}
        key = self._api_key()
        if key:
            headers["authorization"] = f"Bearer {key}"
        try:
            return http1.Pool(url, headers=headers, max_connections=p.max_connections,
                              max_idle=p.max_keepalive_connections, idle_expiry_s=p.keepalive_expiry_s,
                              connect_timeout_s=t.connect_s, acquire_timeout_s=p.acquire_timeout_s)
        except ValueError as exc:
            raise ConfigError(f"backend `{self.name}`: replica {url}: {exc}") from None

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
        return self._open_streams

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
        body = await self._get_json("/v1/models")
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

    # -- plain JSON requests (catalogue, tokenize) --------------------------------------------

    async def _request_json(self, method: str, path: str, body: Any = None, *, spec: RequestSpec | None = None,
                            headers: dict[str, str] | None = None) -> Any:
        """A request that is no stream (catalogue, tokens, embeddings) to the least loaded replica
        that can take it, with `headers` besides the content type."""
        t = self.options.timeouts
        replica = self.fleet.any_replica()
        deadline = asyncio.get_running_loop().time() + t.first_byte_s
        try:
            response = await replica.pool.request(
                method, path, b"" if body is None else _json_encode(body),
                {"content-type": "application/json", **(headers or {})} if body is not None else headers, deadline=deadline,
            )
            try:
                content = await response.read(None if response.status < 400 else MAX_ERROR_BODY, deadline)
            finally:
                await response.aclose()
        except TimeoutError:
            raise UpstreamError(f"Backend `{self.name}` did not answer {method} {path} within {t.first_byte_s:g} s.",
                                kind="timeout") from None
        except http1.HTTPError as exc:
            raise self._transport_error(exc, replica.url) from None
        if response.status >= 400:
            raise error_from_body(response.status, content[:MAX_ERROR_BODY], backend=self.name, spec=spec)
        try:
            return _json_decode(content) if content else None
        except msgspec.DecodeError:
            raise UpstreamError(f"Backend `{self.name}` answered {path} with something that is not JSON.",
                                kind="bad_gateway") from None

    async def _get_json(self, path: str) -> Any:
        body = await self._request_json("GET", path)
        return body if isinstance(body, dict) else {}

    def _transport_error(self, exc: BaseException, url: str = "", *, after_start: bool = False) -> UpstreamError:
        t = self.options.timeouts
        if isinstance(exc, http1.ConnectTimeout):
            return UpstreamError(f"Backend `{self.name}` ({url}) did not accept a connection within "
                                 f"{t.connect_s:g} s.", kind="timeout")
        if isinstance(exc, http1.PoolTimeout):
            return UpstreamError(f"Backend `{self.name}`: all {self.options.pool.max_connections} connections are busy.",
                                 kind="unavailable")
        if isinstance(exc, http1.ConnectError):
            return UpstreamError(f"Backend `{self.name}` ({url}) is unreachable: {exc}", kind="bad_gateway")
        what = "broke the stream" if after_start else "failed"
        return UpstreamError(f"Backend `{self.name}` {what}: {type(exc).__name__}: {exc}", kind="bad_gateway")

    # -- generation ------------------------------------------------------------------------

    def build_body(self, spec: RequestSpec) -> dict[str, Any]:
        body = self.openai_body(spec)
        return self.translate_chat(body, spec) if spec.kind == "chat" else self.translate_completion(body, spec)

    def openai_body(self, spec: RequestSpec) -> dict[str, Any]:
        """The OpenAI-standard part of the upstream body; every sampling value explicit."""
        s = spec.sampling
        body: dict[str, Any] = {"model": self.upstream_name(spec.upstream_model)}
        if spec.kind == "chat":
            body["messages"] = spec.messages
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
                **self.upstream_ids(spec.request_id, spec.headers)}

    @staticmethod
    def upstream_ids(request_id: str, client_headers: dict[str, str]) -> dict[str, str]:
        """What identifies a request upstream: its id, and the W3C trace context the gateway's
        tracing put in `client_headers`."""
        ids = {"x-request-id": request_id}
        for name in TRACE_HEADERS:
            if name in client_headers:
                ids[name] = client_headers[name]
        return ids

    def generate(self, spec: RequestSpec) -> AsyncIterator[Event]:
        """`stream_upstream`, with `<think>` text split out of the content when the options say so."""
        factory = choose_parser(self.options.reasoning_parser, template_source=None, prompt_text=None,
                                chat_template_kwargs=spec.chat_template_kwargs) if spec.kind == "chat" else None
        events = self.stream_upstream(spec)
        if factory is None:
            return events
        return split_reasoning(events, ReasoningSplitter(factory))

    async def stream_upstream(self, spec: RequestSpec) -> AsyncIterator[Event]:
        """Stream one request upstream. A failure before the first event is raised before any
        event (so the gateway still answers with a real status); closing this iterator closes
        the upstream response, which cancels the request upstream."""
        body = self.build_body(spec)  # translation errors: 400 before anything is sent
        path = "/v1/chat/completions" if spec.kind == "chat" else "/v1/completions"
        replica, response, deadline = await self._open(spec, path, _json_encode(body), self.request_headers(spec))
        self._open_streams += 1
        error: BaseException | None = None
        try:
            norm = StreamNormalizer(kind=spec.kind, n=spec.sampling.n, backend=self.name, spec=spec,
                                    content_calls=self.content_calls(spec))
            ctype = response.headers.get("content-type", "")
            if "text/event-stream" not in ctype:
                raw = await self._read_capped(response, deadline, limit=None)
                try:
                    obj = _json_decode(raw)
                except msgspec.DecodeError:
                    raise UpstreamError(f"Backend `{self.name}` answered with {ctype or 'no content type'}, "
                                        "neither SSE nor JSON.", kind="bad_gateway") from None
                for event in norm.feed_response(obj if isinstance(obj, dict) else {}):
                    yield event
            else:
                async for event in self._stream_events(response, norm, deadline):
                    yield event
            yield norm.finish()
        except BaseException as exc:
            error = exc
            raise
        finally:
            try:
                await response.aclose()
            finally:
                self._open_streams -= 1
                self.fleet.finished(replica, spec, error)

    async def _open(self, spec: RequestSpec, path: str, content: bytes,
                    headers: dict[str, str]) -> tuple[Replica, http1.Response, float]:
        """Send the request to the replica the fleet picks and wait for a 200 response head.
        A failure there that another replica may not share (unreachable, 5xx, 429, no answer in
        time) is tried on the next replica, up to `replica_attempts`. Sets `spec.replica`."""
        tried: list[Replica] = []
        loop = asyncio.get_running_loop()
        while True:
            replica = self.fleet.choose(spec, tried)
            tried.append(replica)
            spec.replica = replica.url
            deadline = loop.time() + self.options.timeouts.first_byte_s
            try:
                response = await self._send(replica, path, content, headers, deadline)
                if response.status != 200:
                    try:
                        raw = await self._read_capped(response, deadline)
                    finally:
                        await response.aclose()
                    raise error_from_body(response.status, raw, backend=self.name, spec=spec)
            except BaseException as exc:
                self.fleet.finished(replica, spec, exc, before_first_byte=True)
                if isinstance(exc, SwitchyardError) and self.fleet.can_retry(exc, tried):
                    log.info("backend %s: replica %s failed before the first byte (%s); trying another replica",
                             self.name, replica.url, exc.message)
                    continue
                raise
            return replica, response, deadline

    async def _stream_events(self, response: http1.Response, norm: StreamNormalizer,
                             deadline: float) -> AsyncIterator[Event]:
        """The SSE body's events, normalized; after `[DONE]` the rest of the body (the chunked
        terminator) is read, so that the connection stays reusable."""
        parser = SSEParser()
        pieces = self._pieces(response, deadline)
        async for piece in pieces:
            for sse in parser.feed(piece):
                if sse.event not in ("message", "error"):
                    continue
                for event in norm.feed_data(sse.data):
                    yield event
                if norm.done:
                    await self._drain(response)
                    return

    async def _send(self, replica: Replica, path: str, content: bytes, headers: dict[str, str],
                    deadline: float) -> http1.Response:
        """POST and wait for the response head, under the first-byte deadline."""
        try:
            response = await replica.pool.request("POST", path, content, headers, deadline=deadline)
        except TimeoutError:
            raise UpstreamError(f"Backend `{self.name}` ({replica.url}) sent no response within "
                                f"{self.options.timeouts.first_byte_s:g} s.", kind="timeout") from None
        except http1.HTTPError as exc:
            raise self._transport_error(exc, replica.url) from None
        log.debug("backend %s: POST %s%s -> %d", self.name, replica.url, path, response.status)
        return response

    async def _pieces(self, response: http1.Response, deadline: float) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (no re-chunking); the first piece under the first-byte
        deadline, every later one under the idle timeout."""
        t = self.options.timeouts
        loop = asyncio.get_running_loop()
        when = deadline
        first = True
        while True:
            try:
                piece = await response.next_piece(when)
            except TimeoutError:
                if first:
                    raise UpstreamError(f"Backend `{self.name}` sent no data within {t.first_byte_s:g} s.",
                                        kind="timeout") from None
                raise UpstreamError(f"Backend `{self.name}` stalled for {t.idle_s:g} s in the middle of a response.",
                                    kind="timeout") from None
            except http1.HTTPError as exc:
                raise self._transport_error(exc, after_start=True) from None
            if piece is None:
                return
            first = False
            when = loop.time() + t.idle_s
            yield piece

    async def _drain(self, response: http1.Response) -> None:
        try:
            await response.read(MAX_ERROR_BODY, asyncio.get_running_loop().time() + 1.0)
        except (TimeoutError, http1.HTTPError):
            pass

    async def _read_capped(self, response: http1.Response, deadline: float, limit: int | None = MAX_ERROR_BODY) -> bytes:
        chunks: list[bytes] = []
        size = 0
        try:
            async for piece in self._pieces(response, deadline):
                chunks.append(piece)
                size += len(piece)
                if limit is not None and size >= limit:
                    break
        except UpstreamError:
            if not chunks:
                raise
        return b"".join(chunks)

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        return await embed_upstream(self, request)

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


def check_extensions(names: list[str], *, backend_type: str) -> frozenset[str]:
    unknown = sorted(set(names) - EXTENSIONS)
    if unknown:
        raise ConfigError(f"backend type `{backend_type}`: unknown extension(s) {', '.join(unknown)} in "
                          f"`options.extensions` (known: {', '.join(sorted(EXTENSIONS))})")
    return frozenset(names)
