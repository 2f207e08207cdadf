"""Engine load signals: what a replica's engine says about its own queue, parsed from the
engine's own endpoints.

- `vllm_metrics`: vLLM's Prometheus `/metrics` — `vllm:num_requests_running`,
  `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`, `vllm:prefix_cache_queries_total` /
  `vllm:prefix_cache_hits_total` (tokens), and the KV cache's size in tokens from
  `vllm:cache_config_info` (`kv_cache_size_tokens`, else `num_gpu_blocks` x `block_size`).
- `llamacpp_metrics`: llama-server's `/metrics` (`--metrics`) — `llamacpp:requests_processing`,
  `llamacpp:requests_deferred`, prompt tokens processed and reused from its cache.
- `llamacpp_slots`: llama-server's `/slots` (`--slots`) — slots processing out of all slots,
  and how many slots there are (no queue length: requests waiting for a slot are not listed
  there).

Samples of a metric are summed over their labels (several engines or models behind one
server). A scrape is searched for the few metrics it needs (`str.find`, C speed), never split
line by line in Python, so that parsing it on the event loop costs well under a millisecond.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """One scrape of one replica. `at` is the loop time it was taken; counts are requests."""

    running: float
    waiting: float
    at: float
    kv_cache_usage: float | None = None  # 0..1 (llama.cpp /slots: busy slots / slots)
    prefix_queried_tokens: float | None = None  # counters since the engine started
    prefix_hit_tokens: float | None = None
    cache_tokens: int | None = None  # the engine's KV cache capacity, in tokens
    slots: int | None = None  # requests the engine runs at once, where it says (llama.cpp `/slots`)


@dataclass(frozen=True, slots=True)
class LoadSource:
    """Where and how a load signal is read: GET `path`, then `parse(text, at)`."""

    name: str
    path: str
    parse: Callable[[str, float], LoadSnapshot]


class LoadSignalError(ValueError):
    """A scrape whose body is not what the source should answer."""


def _sums(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Each metric's samples summed over their labels. Lines are found with `str.find` (a vLLM
    scrape is ~55 KB; this reads it in ~0.2 ms), never split in Python."""
    text = "\n" + text
    sums: dict[str, float] = {}
    for name in names:
        needle = "\n" + name
        at = text.find(needle)
        while at >= 0:
            end = text.find("\n", at + 1)
            line = text[at + 1:] if end < 0 else text[at + 1:end]
            rest = line[len(name):]
            if rest[:1] in ("{", " ", "\t"):
                value = rest.rsplit("}", 1)[-1].split()
                try:
                    sums[name] = sums.get(name, 0.0) + float(value[0])
                except (IndexError, ValueError):
                    raise LoadSignalError(f"a sample of {name} is not a number: {line[:200]!r}") from None
            at = text.find(needle, at + 1)
    return sums


_VLLM = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
         "vllm:gpu_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def parse_vllm_metrics(text: str, at: float) -> LoadSnapshot:
    sums = _sums(text, _VLLM)
    if "vllm:num_requests_running" not in sums:
        raise LoadSignalError("no vllm:num_requests_running in the scrape")
    kv = sums.get("vllm:kv_cache_usage_perc", sums.get("vllm:gpu_cache_usage_perc"))
    return LoadSnapshot(
        running=sums["vllm:num_requests_running"], waiting=sums.get("vllm:num_requests_waiting", 0.0), at=at,
        kv_cache_usage=kv, prefix_queried_tokens=sums.get("vllm:prefix_cache_queries_total"),
        prefix_hit_tokens=sums.get("vllm:prefix_cache_hits_total"), cache_tokens=_vllm_cache_tokens(text),
    )


def _vllm_cache_tokens(text: str) -> int | None:
    total = 0
    needle = "\nvllm:cache_config_info{"
    at = text.find(needle)
    while at >= 0:
        start = at + len(needle)
        info = dict(_LABEL.findall(text, start, text.find("}", start)))
        at = text.find(needle, start)
        try:
            if info.get("kv_cache_size_tokens", "None") != "None":
                total += int(info["kv_cache_size_tokens"])
            else:
                total += int(info["num_gpu_blocks"]) * int(info["block_size"])
        except (KeyError, ValueError):
            continue
    return total or None


_LLAMACPP = ("llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:prompt_tokens_total",
             "llamacpp:prompt_tokens_cached_total", "llamacpp:kv_cache_usage_ratio")


def parse_llamacpp_metrics(text: str, at: float) -> LoadSnapshot:
    sums = _sums(text, _LLAMACPP)
    if "llamacpp:requests_processing" not in sums:
        raise LoadSignalError("no llamacpp:requests_processing in the scrape")
    processed, cached = sums.get("llamacpp:prompt_tokens_total"), sums.get("llamacpp:prompt_tokens_cached_total")
    queried = None if processed is None or cached is None else processed + cached
    return LoadSnapshot(
        running=sums["llamacpp:requests_processing"], waiting=sums.get("llamacpp:requests_deferred", 0.0), at=at,
        kv_cache_usage=sums.get("llamacpp:kv_cache_usage_ratio"), prefix_queried_tokens=queried, prefix_hit_tokens=cached,
    )


def parse_llamacpp_slots(text: str, at: float) -> LoadSnapshot:
    try:
        slots = json.loads(text)
    except ValueError:
        raise LoadSignalError("/slots is not JSON") from None
    if not isinstance(slots, list) or not all(isinstance(s, dict) for s in slots):
        raise LoadSignalError("/slots is not a list of slots")
    busy = sum(1 for s in slots if s.get("is_processing"))
    n_ctx = sum(s["n_ctx"] for s in slots if isinstance(s.get("n_ctx"), int))
    return LoadSnapshot(running=float(busy), waiting=0.0, at=at, kv_cache_usage=busy / len(slots) if slots else None,
                        cache_tokens=n_ctx or None, slots=len(slots))


LOAD_SOURCES: dict[str, LoadSource] = {
    "vllm_metrics": LoadSource("vllm_metrics", "/metrics", parse_vllm_metrics),
    "llamacpp_metrics": LoadSource("llamacpp_metrics", "/metrics", parse_llamacpp_metrics),
    "llamacpp_slots": LoadSource("llamacpp_slots", "/slots", parse_llamacpp_slots),
}
