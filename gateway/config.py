"""`plugins.toml`: parsed once at start-up into msgspec structs.

Unknown keys and bad values stop start-up with a `ConfigError` naming the file and the key.
Backend `options` tables are validated against the struct their backend type declares, which
needs the plugin manager, so `load_config` does the file and `resolve_backends` the options.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from plugins.contract.config_types import BackendType, Route, Target
from plugins.contract.errors import ConfigError


class _Config(Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class KeyConfig(_Config):
    """`[[server.keys]]`: one client API key, written here (`key`) or, better, named by the
    environment variable that holds it (`key_env`), the routes (model names) it may use, and
    its limits (gateway/keys: enforced per key, across workers and replicas with a shared
    `server.state`)."""

    name: str | None = None  # a label for logs; never the key. Default: `keys[i]`
    key: Annotated[str, Meta(min_length=1)] | None = None
    key_env: Annotated[str, Meta(min_length=1)] | None = None
    routes: list[str] | None = None  # None: every route; a list: only these model/route names
    rpm: Annotated[int, Meta(ge=1)] | None = None  # requests per minute
    tpm: Annotated[int, Meta(ge=1)] | None = None  # prompt + completion tokens per minute
    max_parallel: Annotated[int, Meta(ge=1)] | None = None  # requests in flight at once
    budget_tokens: Annotated[int, Meta(ge=1)] | None = None  # tokens per `budget_period`
    budget_period: Literal["day", "month"] | None = None  # calendar day (default) or month, UTC
    # flow control (`[server.flow_control]`): the key's share of a full backend against the
    # other keys, and the `priority` of its requests that send none (None: 0)
    weight: Annotated[float, Meta(gt=0.0)] = 1.0
    priority: int | None = None

    @property
    def has_limits(self) -> bool:
        return any(v is not None for v in (self.rpm, self.tpm, self.max_parallel, self.budget_tokens))

    def __repr__(self) -> str:  # never show a key
        return f"KeyConfig(name={self.name!r}, key={'***' if self.key else None}, key_env={self.key_env!r}, routes={self.routes!r})"


class FlowControlConfig(_Config):
    """`[server.flow_control]`: the queue each backend opens when it is full (gateway/flow_control)."""

    enabled: bool = False
    # who a request counts against in the fair order: the client key's `name`, the request's
    # `user`, its agent session, or any header (`header:x-tenant`); without one: its key
    tenant: Annotated[str, Meta(pattern=r"^(key|user|session|header:[A-Za-z0-9_-]+)$")] = "key"
    # `priority` (lower is served earlier) to band: band i holds the priorities below edge i and
    # at or above edge i-1; [0, 1]: negative = band 0 (first), 0 = band 1, positive = band 2
    band_edges: tuple[int, ...] = (0, 1)
    # a waiting request rises one band per `aging_s` waited; 0: bands are strict
    aging_s: Annotated[float, Meta(ge=0.0)] = 30.0
    # what a request may say about its own priority: "honour" it, "lower_only" (only ask to be
    # served later than its key's `priority`), or "ignore" it
    client_priority: Literal["honour", "lower_only", "ignore"] = "honour"
    max_queue: Annotated[int, Meta(ge=0)] = 1024  # waiting requests per backend (all workers with `state`)
    queue_timeout_s: Annotated[float, Meta(gt=0.0)] = 60.0  # the longest wait; then 429 with Retry-After
    # the time-to-first-token objective of routes without their own; None: no SLO shedding
    ttft_slo_ms: Annotated[int, Meta(ge=1)] | None = None
    # a request's cost is its prompt's estimated tokens plus its `max_tokens` up to this (0: all of it)
    output_tokens_cap: Annotated[int, Meta(ge=0)] = 1024
    rate_smoothing: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.2  # how far each completion moves the service rate
    # while requests wait: how often capacity is re-read (and, with `state`, other workers' grants collected)
    poll_interval_s: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.02


class BackendFlowConfig(_Config):
    """`[backends.flow_control]`: one backend's slots and queue bounds (None: the server's)."""

    # requests each replica runs at once; None: the backend's `max_concurrent`, else the
    # engines' own reports (a replica reporting a queue of its own is full)
    replica_concurrency: Annotated[int, Meta(ge=1)] | None = None
    # slots each replica keeps beyond `replica_concurrency` that only requests sent in the top
    # band (band 0; not those aged into it) may be granted; its engines must run that many more
    # (llama-server -np, vLLM max_num_seqs). 0: none
    priority_headroom: Annotated[int, Meta(ge=0)] = 0
    max_queue: Annotated[int, Meta(ge=0)] | None = None
    queue_timeout_s: Annotated[float, Meta(gt=0.0)] | None = None


class ServerConfig(_Config):
    host: str = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65535)] = 8000
    # processes serving the port (`gateway.worker_pool`); "auto": one per core
    workers: Annotated[int, Meta(ge=1, le=256)] | Literal["auto"] = 1
    max_body_bytes: Annotated[int, Meta(gt=0)] = 4 * 1024 * 1024
    # API keys clients must send as `Authorization: Bearer <key>`; empty means no auth. Also
    # read from $SWITCHYARD_API_KEYS (comma-separated). Keys with allowed routes: `keys`.
    api_keys: list[str] = []
    keys: list[KeyConfig] = []
    max_n: Annotated[int, Meta(ge=1, le=128)] = 16
    max_messages: Annotated[int, Meta(ge=1)] = 1024  # chat `messages` per request
    # the most `max_tokens` (or `max_completion_tokens`) a request may ask for, and the value
    # used when it asks for none; None: no cap. A route's own `max_tokens` overrides it.
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    # what a request that asks for no `max_tokens` gets (at most `max_tokens`); None: the cap,
    # or no limit without one. A route's own `default_max_tokens` overrides it.
    default_max_tokens: Annotated[int, Meta(ge=1)] | None = None
    # an output limit over `max_tokens` (or the model's context): "reject" answers a 400 naming
    # the field; "clamp" lowers it to the cap and to the context left after the prompt, says so
    # in `x-switchyard-max-tokens-clamped`, and the answer ends with the API's length reason.
    # A route's own `over_max_tokens` overrides it.
    over_max_tokens: Literal["reject", "clamp"] = "reject"
    # the field(s) chat completions carry the model's thinking in: "reasoning" (vLLM >= 0.10),
    # "reasoning_content" (DeepSeek, llama.cpp, older vLLM) or "both"
    reasoning_field: Literal["reasoning", "reasoning_content", "both"] = "both"
    # a request's whole time, queueing included: 504 before the first byte, an error event
    # after it. None: no deadline. A route's own `request_timeout_s` overrides it.
    request_timeout_s: Annotated[float, Meta(gt=0.0)] | None = None
    # on SIGTERM: stop accepting, let requests in flight finish for this long, then end the
    # rest with an error event (`switchyard serve --drain-seconds` overrides it)
    drain_timeout_s: Annotated[float, Meta(ge=0.0)] = 30.0
    system_fingerprint: str = "fp_switchyard"
    log_level: str = "info"
    # JSONL request log for `switchyard ab-report`: one line per request; None: no log
    request_log: str | None = None
    log_prompts: bool = False  # also write each request's messages/prompt into the request log
    # health probes of every backend (`backend.health()`); 0 turns the periodic probes off
    health_interval_s: Annotated[float, Meta(ge=0.0)] = 5.0
    health_timeout_s: Annotated[float, Meta(gt=0.0)] = 2.0
    # circuit breaker per backend: open after this many consecutive failures (probes, or requests
    # failing with an upstream error), half-open probe after the cool-down
    breaker_failures: Annotated[int, Meta(ge=1)] = 3
    breaker_cooldown_s: Annotated[float, Meta(ge=0.0)] = 15.0
    # where per-key limits keep their counts: None in this process, or "redis://host:port/db"
    # (shared by every worker and replica); what to do when that store cannot be reached
    state: Annotated[str, Meta(pattern=r"^rediss?://")] | None = None
    on_state_error: Literal["allow", "deny"] = "allow"
    state_timeout_s: Annotated[float, Meta(gt=0.0)] = 0.5
    flow_control: FlowControlConfig = msgspec.field(default_factory=FlowControlConfig)
    # Responses tools OpenAI runs on its side (web_search, file_search, code_interpreter, mcp...),
    # which no engine here can run: "drop" leaves them out (named in `x-switchyard-dropped-tools`),
    # "reject" answers 400. A route's own value overrides it.
    hosted_tools: Literal["drop", "reject"] = "drop"
    # take Claude Code's `x-anthropic-billing-header: ...` line out of system prompts before
    # they are rendered (gateway/http/billing_header.py); a route's own value overrides it
    strip_billing_header: bool = True

    def __repr__(self) -> str:  # never show a key
        shown = {f: getattr(self, f) for f in self.__struct_fields__}
        shown["api_keys"] = ["***"] * len(self.api_keys)
        if self.state:
            shown["state"] = re.sub(r"//[^@/]*@", "//***@", self.state)
        return f"ServerConfig({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


class PluginsConfig(_Config):
    # plugin names (built-in or entry point) that must not load
    disable: list[str] = []
    # extra importable modules to register as plugins
    modules: list[str] = []


class BackendConfig(_Config):
    name: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.-]+$")]
    type: str
    options: dict[str, Any] = {}
    # admission control per backend: at most `max_concurrent` requests run at once (None: no
    # limit); up to `max_queue` more wait for a slot, at most `queue_timeout_s`; beyond that
    # the client gets 429 with `Retry-After` (or, on a fallback route, the next target)
    max_concurrent: Annotated[int, Meta(ge=1)] | None = None
    max_queue: Annotated[int, Meta(ge=0)] = 0
    queue_timeout_s: Annotated[float, Meta(gt=0.0)] = 30.0
    flow_control: BackendFlowConfig | None = None  # with `[server.flow_control]` on

    def __repr__(self) -> str:  # never show an upstream key
        options = {k: "***" if k == "api_key" and v else v for k, v in self.options.items()}
        return (f"BackendConfig(name={self.name!r}, type={self.type!r}, options={options!r}, "
                f"max_concurrent={self.max_concurrent!r}, max_queue={self.max_queue!r}, queue_timeout_s={self.queue_timeout_s!r})")


class TargetConfig(_Config):
    backend: str
    model: str | None = None  # default: the route's name
    weight: Annotated[float, Meta(ge=0.0)] = 1.0


class ShadowConfig(_Config):
    """Mirror a share of a route's requests to another backend; its answers are discarded."""

    backend: str
    model: str | None = None  # default: the route's name
    fraction: Annotated[float, Meta(ge=0.0, le=1.0)] = 1.0
    max_concurrent: Annotated[int, Meta(ge=1)] = 64  # shadow requests in flight; more are skipped


class RouteConfig(_Config):
    name: str  # the model name clients send; a glob (`claude-*`) matches many and is not listed
    targets: Annotated[list[TargetConfig], Meta(min_length=1)]
    # more names this route answers to: exact names, or globs (`gpt-*-codex`) tried in declared
    # order after every exact name (gateway.service.model_names)
    aliases: list[Annotated[str, Meta(min_length=1)]] = []
    strategy: str = "weighted"
    options: dict[str, Any] = {}
    # targets one request may try before its error goes to the client (only failures before the
    # first token are retried); default: every target for `fallback`, 1 for the other strategies
    max_attempts: Annotated[int, Meta(ge=1)] | None = None
    shadow: ShadowConfig | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None  # default: `server.max_tokens`
    default_max_tokens: Annotated[int, Meta(ge=1)] | None = None  # default: `server.default_max_tokens`
    over_max_tokens: Literal["reject", "clamp"] | None = None  # default: `server.over_max_tokens`
    request_timeout_s: Annotated[float, Meta(gt=0.0)] | None = None  # default: `server.request_timeout_s`
    ttft_slo_ms: Annotated[int, Meta(ge=1)] | None = None  # default: `server.flow_control.ttft_slo_ms`
    hosted_tools: Literal["drop", "reject"] | None = None  # default: `server.hosted_tools`
    strip_billing_header: bool | None = None  # default: `server.strip_billing_header`


class TelemetryConfig(_Config):
    """`[telemetry]`: OpenTelemetry traces (gateway/observability/telemetry.py), off unless `otlp_endpoint` is set."""

    otlp_endpoint: Annotated[str, Meta(pattern=r"^https?://")] | None = None  # OTLP/HTTP (protobuf)
    service_name: Annotated[str, Meta(min_length=1)] = "switchyard"
    sample_ratio: Annotated[float, Meta(ge=0.0, le=1.0)] = 1.0  # of the traces this gateway starts


class StoreConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """`[responses]` in plugins.toml."""

    store: Literal["sqlite", "redis", "none"] = "sqlite"
    sqlite_path: str = "~/.cache/switchyard/responses.sqlite3"
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_prefix: str = "switchyard:response:"
    ttl_s: float | None = None  # stored responses older than this are gone; None: kept
    # the key that seals reasoning items' `encrypted_content` (responses_api/reasoning_seal.py);
    # made on first start, shared by the workers; replicas share the file to read each other's
    reasoning_key_file: str = "~/.cache/switchyard/reasoning.key"


class Config(_Config):
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    responses: StoreConfig = msgspec.field(default_factory=StoreConfig)  # the Responses API's store
    plugins: PluginsConfig = msgspec.field(default_factory=PluginsConfig)
    telemetry: TelemetryConfig = msgspec.field(default_factory=TelemetryConfig)
    backends: list[BackendConfig] = []
    routes: list[RouteConfig] = []
    source: str = "<defaults>"  # where it was read from; not a TOML key

    def routes_resolved(self) -> list[Route]:
        return [
            Route(
                name=r.name,
                strategy=r.strategy,
                options=r.options,
                targets=tuple(Target(backend=t.backend, model=t.model or r.name, weight=t.weight) for t in r.targets),
            )
            for r in self.routes
        ]


_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<field>[^`]+)`")


def _key_of(exc: msgspec.ValidationError, prefix: str = "") -> tuple[str, str]:
    """Turn msgspec's `$.backends[0].options` path into a TOML-ish key and a reason."""
    text = str(exc)
    path = ""
    match = _PATH.search(text)
    if match:
        path, text = match["path"].lstrip("."), text[: match.start()]
    unknown = _UNKNOWN.search(text)
    if unknown:
        path = f"{path}.{unknown['field']}" if path else unknown["field"]
        text = "unknown key"
    key = ".".join(p for p in (prefix, path) if p)
    return key or "(top level)", text


def parse_config(text: str, source: str) -> Config:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    if "source" in raw:
        raise ConfigError(f"{source}: unknown key `source`")
    try:
        config = msgspec.convert(raw, Config)
    except msgspec.ValidationError as exc:
        key, reason = _key_of(exc)
        raise ConfigError(f"{source}: {reason} at `{key}`", param=key) from None
    _check_names(config, source)
    _check_output_caps(config, source)
    check_store_config(config.responses, source)
    _check_keys(config, source)
    _check_flow_control(config.server.flow_control, source)
    _check_backend_flow(config, source)
    env_keys = [k.strip() for k in os.environ.get("SWITCHYARD_API_KEYS", "").split(",") if k.strip()]
    server = msgspec.structs.replace(config.server, api_keys=[*config.server.api_keys, *env_keys])
    return msgspec.structs.replace(config, server=server, source=source)


def check_store_config(config: StoreConfig, source: str) -> None:
    """What can be told before start-up: the keys' values (the file and the server are opened
    by `open_store`)."""
    if config.store == "sqlite" and not config.sqlite_path.strip():
        raise ConfigError(f"{source}: empty path at `responses.sqlite_path`", param="responses.sqlite_path")
    if config.store == "redis" and not config.redis_url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(f"{source}: not a redis:// URL at `responses.redis_url`", param="responses.redis_url")
    if config.ttl_s is not None and config.ttl_s <= 0:
        raise ConfigError(f"{source}: must be above 0 at `responses.ttl_s`", param="responses.ttl_s")
    if not config.reasoning_key_file.strip():
        raise ConfigError(f"{source}: empty path at `responses.reasoning_key_file`", param="responses.reasoning_key_file")


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the configuration file: {exc.strerror}") from None
    return parse_config(text, str(path))


def _check_names(config: Config, source: str) -> None:
    seen: set[str] = set()
    for i, backend in enumerate(config.backends):
        if backend.name in seen:
            raise ConfigError(f"{source}: duplicate backend name {backend.name!r} at `backends[{i}].name`")
        seen.add(backend.name)
    route_names: set[str] = set()
    for i, route in enumerate(config.routes):
        if route.name in route_names:
            raise ConfigError(f"{source}: duplicate route name {route.name!r} at `routes[{i}].name`")
        route_names.add(route.name)
        for j, target in enumerate(route.targets):
            if target.backend not in seen:
                raise ConfigError(
                    f"{source}: route {route.name!r} targets unknown backend {target.backend!r} "
                    f"at `routes[{i}].targets[{j}].backend`"
                )
        if route.shadow is not None and route.shadow.backend not in seen:
            raise ConfigError(
                f"{source}: route {route.name!r} shadows to unknown backend {route.shadow.backend!r} "
                f"at `routes[{i}].shadow.backend`"
            )


def _check_output_caps(config: Config, source: str) -> None:
    """A `default_max_tokens` is at most the `max_tokens` cap in force where it applies."""
    server = config.server
    where = [("server", server.max_tokens, server.default_max_tokens)]
    where += [(f"routes[{i}]", r.max_tokens or server.max_tokens, r.default_max_tokens or server.default_max_tokens)
              for i, r in enumerate(config.routes)]
    for key, cap, default in where:
        if cap is not None and default is not None and default > cap:
            raise ConfigError(f"{source}: `default_max_tokens` ({default}) is above the `max_tokens` cap ({cap}) "
                              f"at `{key}.default_max_tokens`", param=f"{key}.default_max_tokens")


def _check_keys(config: Config, source: str) -> None:
    """Each `[[server.keys]]` names its key exactly once, and a `key_env` is set (the message
    names the variable, never a value). A key with limits has a name of its own: its counts are
    kept under that name, shared by every replica."""
    names: set[str] = set()
    for i, entry in enumerate(config.server.keys):
        where = f"server.keys[{i}]"
        if (entry.key is None) == (entry.key_env is None):
            raise ConfigError(f"{source}: set exactly one of `key` and `key_env` at `{where}`", param=where)
        if entry.has_limits and not entry.name:
            raise ConfigError(f"{source}: a key with limits needs a `name` (its usage is counted under it) at `{where}.name`",
                              param=f"{where}.name")
        if entry.budget_period is not None and entry.budget_tokens is None:
            raise ConfigError(f"{source}: `budget_period` needs `budget_tokens` at `{where}.budget_period`",
                              param=f"{where}.budget_period")
        if entry.name and entry.name in names:
            raise ConfigError(f"{source}: duplicate key name {entry.name!r} at `{where}.name`", param=f"{where}.name")
        names.add(entry.name or "")
        if entry.key_env is not None and not os.environ.get(entry.key_env, "").strip():
            raise ConfigError(
                f"{source}: the environment variable {entry.key_env!r} named at `{where}.key_env` is not set",
                param=f"{where}.key_env",
            )


def _check_flow_control(flow: FlowControlConfig, source: str) -> None:
    """What msgspec's constraints cannot say: the band edges ascend strictly, at most 16 bands."""
    edges, where = flow.band_edges, "server.flow_control.band_edges"
    if any(b <= a for a, b in zip(edges, edges[1:])):
        raise ConfigError(f"{source}: `band_edges` must ascend strictly, got {list(edges)} at `{where}`", param=where)
    if len(edges) > 15:
        raise ConfigError(f"{source}: at most 15 `band_edges` (16 bands), got {len(edges)} at `{where}`", param=where)


def _check_backend_flow(config: Config, source: str) -> None:
    """A `priority_headroom` adds to `replica_concurrency` (so it needs one), and is for the top
    band only (so it needs more than one band)."""
    for i, backend in enumerate(config.backends):
        table = backend.flow_control
        if table is None or not table.priority_headroom:
            continue
        where = f"backends[{i}].flow_control.priority_headroom"
        if table.replica_concurrency is None:
            raise ConfigError(f"{source}: `priority_headroom` is slots beyond `replica_concurrency`, which is not set, "
                              f"at `{where}`", param=where)
        if not config.server.flow_control.band_edges:
            raise ConfigError(f"{source}: `priority_headroom` is for the top band, and `server.flow_control.band_edges` "
                              f"makes one band of every request, at `{where}`", param=where)


def resolve_backend_options(config: Config, types: dict[str, BackendType]) -> list[tuple[BackendConfig, BackendType, Any]]:
    """Each backend table with its type and its options decoded into that type's struct."""
    resolved = []
    for i, backend in enumerate(config.backends):
        btype = types.get(backend.type)
        if btype is None:
            known = ", ".join(sorted(types)) or "none"
            raise ConfigError(
                f"{config.source}: unknown backend type {backend.type!r} at `backends[{i}].type` (known: {known})",
                param=f"backends[{i}].type",
            )
        try:
            options = msgspec.convert(backend.options, btype.options)
        except msgspec.ValidationError as exc:
            key, reason = _key_of(exc, prefix=f"backends[{i}].options")
            raise ConfigError(f"{config.source}: {reason} at `{key}`", param=key) from None
        resolved.append((backend, btype, options))
    return resolved
