"""The fleet knobs of a proxy backend's `[backends.options]` table (documented in README.md,
"Fronting a fleet"); decoded once at start-up with the rest of the backend's options."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

BalanceName = Literal["round_robin", "least_busy", "least_load", "prefix_cache"]


class _Options(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    pass


class DiscoveryOptions(_Options):
    """`[backends.options.discovery]`: where the replica list comes from when it changes.

    - `type = "dns"`: every A/AAAA record of `name` is a replica at `scheme://address:port`,
      re-resolved every `interval_s`; `resolver` ("host" or "host:port") asks that DNS server
      instead of the system's resolver.
    - `type = "file"`: a JSON list of base URLs (or `{"endpoints": [...]}`), or a TOML file with
      `endpoints = [...]`, re-read when it changes (checked every `interval_s`).
    """

    type: Literal["dns", "file"]
    name: str = ""
    port: Annotated[int, Meta(ge=1, le=65535)] | None = None
    scheme: Literal["http", "https"] = "http"
    resolver: str | None = None
    path: str = ""
    interval_s: Annotated[float, Meta(gt=0.0)] = 5.0
    timeout_s: Annotated[float, Meta(gt=0.0)] = 2.0


class LoadSignalOptions(_Options):
    """`[backends.options.load_signals]`: scrape each replica's engine for its queue.

    `source`: "auto" (the backend type's own: vLLM `/metrics`; llama.cpp `/metrics`, else
    `/slots`; none for `openai_compatible`), a source by name, or "none"."""

    source: Literal["auto", "vllm_metrics", "llamacpp_metrics", "llamacpp_slots", "none"] = "auto"
    interval_s: Annotated[float, Meta(gt=0.0)] = 1.0


class PrefixCacheOptions(_Options):
    """How `prefix_cache` placement keeps and reads its prefix index (per backend, or per route
    as a route's `options`)."""

    block_chars: Annotated[int, Meta(ge=8)] = 128
    max_index_bytes: Annotated[int, Meta(ge=65536)] = 32 * 1024 * 1024
    min_match_ratio: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.5
    load_margin: Annotated[float, Meta(ge=0.0)] = 4.0
    replica_cache_tokens: Annotated[int, Meta(ge=1)] | None = None
    max_sessions: Annotated[int, Meta(ge=0)] = 65536  # agent sessions remembered (LRU); 0: sessions not used


class ReplicaBreakerOptions(_Options):
    """`[backends.options.replica_breaker]`: each replica's own circuit breaker."""

    failures: Annotated[int, Meta(ge=1)] = 3
    cooldown_s: Annotated[float, Meta(ge=0.0)] = 15.0
