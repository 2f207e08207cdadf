"""The options every proxy backend shares (`[backends.options]` in plugins.toml), validated
once at start-up by msgspec (an unknown key or a bad value is a `ConfigError` naming it)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from plugins.contract.errors import ConfigError
from plugins.contract.protocol import EXTENSIONS
from plugins.contract.system_turns import SystemMessages
from plugins.fleet.options import (
    BalanceName,
    DiscoveryOptions,
    LoadSignalOptions,
    PrefixCacheOptions,
    ReplicaBreakerOptions,
)


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
    - `embeddings`: the upstream serves `/v1/embeddings` (see `plugins.proxy.embeddings`).
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
    # system messages after the first (Claude Code's environment turn): "in_place" sends them
    # where they stand (the upstream's template renders or refuses them), "fold" joins them into
    # the first one (plugins/contract/system_turns.py)
    system_messages: SystemMessages = "in_place"

    def __repr__(self) -> str:  # never show a key
        fields = []
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if name == "api_key" and value is not None:
                value = "***"
            fields.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(fields)})"


def check_extensions(names: list[str], *, backend_type: str) -> frozenset[str]:
    unknown = sorted(set(names) - EXTENSIONS)
    if unknown:
        raise ConfigError(f"backend type `{backend_type}`: unknown extension(s) {', '.join(unknown)} in "
                          f"`options.extensions` (known: {', '.join(sorted(EXTENSIONS))})")
    return frozenset(names)
