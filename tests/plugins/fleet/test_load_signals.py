"""The engines' load reports, parsed: against real scrapes recorded from the real servers by
`scripts/record_load_signals.py` (idle, busy, after a repeated long prompt)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plugins.fleet.load_signals import LoadSignalError, parse_llamacpp_metrics, parse_llamacpp_slots, parse_vllm_metrics

RECORDINGS = Path(__file__).resolve().parents[2] / "recordings" / "load_signals"


def recorded(engine: str, path: str, when: str) -> dict:
    doc = json.loads((RECORDINGS / f"{engine}_{path}_{when}.json").read_text())
    assert doc["status"] == 200 and doc["engine"] == engine and doc["when"] == when
    return doc


def test_vllm_metrics_idle_busy_after() -> None:
    idle = parse_vllm_metrics(recorded("vllm", "metrics", "idle")["body"], at=1.0)
    busy = parse_vllm_metrics(recorded("vllm", "metrics", "busy")["body"], at=2.0)
    after = parse_vllm_metrics(recorded("vllm", "metrics", "after")["body"], at=3.0)
    assert (idle.running, idle.waiting, idle.kv_cache_usage) == (0.0, 0.0, 0.0)
    assert busy.running + busy.waiting >= 1 and busy.kv_cache_usage > 0
    assert (after.running, after.waiting) == (0.0, 0.0)
    # the repeated long prompt hit the prefix cache (counted in tokens)
    assert after.prefix_hit_tokens > idle.prefix_hit_tokens
    assert after.prefix_queried_tokens > after.prefix_hit_tokens > 0
    # the KV cache's size from vllm:cache_config_info: 1 GiB of this model's KV
    assert idle.cache_tokens == 46592 and busy.at == 2.0


def test_llamacpp_metrics_idle_busy_after() -> None:
    idle = parse_llamacpp_metrics(recorded("llamacpp", "metrics", "idle")["body"], at=0.0)
    busy_doc = recorded("llamacpp", "metrics", "busy")
    busy = parse_llamacpp_metrics(busy_doc["body"], at=0.0)
    after = parse_llamacpp_metrics(recorded("llamacpp", "metrics", "after")["body"], at=0.0)
    assert (idle.running, idle.waiting) == (0.0, 0.0)
    # two slots: two of the four streams run, two wait (deferred)
    assert (busy.running, busy.waiting) == (2.0, 2.0) and busy_doc["in_flight"] == 4
    assert after.prefix_hit_tokens > 0 and after.prefix_queried_tokens > after.prefix_hit_tokens


def test_llamacpp_slots_idle_busy() -> None:
    idle = parse_llamacpp_slots(recorded("llamacpp", "slots", "idle")["body"], at=0.0)
    busy = parse_llamacpp_slots(recorded("llamacpp", "slots", "busy")["body"], at=0.0)
    assert (idle.running, idle.kv_cache_usage, idle.cache_tokens, idle.slots) == (0.0, 0.0, 4096, 2)
    assert (busy.running, busy.kv_cache_usage) == (2.0, 1.0)


@pytest.mark.parametrize("parse", [parse_vllm_metrics, parse_llamacpp_metrics, parse_llamacpp_slots])
def test_a_body_of_another_kind_is_refused(parse) -> None:  # noqa: ANN001
    other = recorded("vllm", "metrics", "idle")["body"] if parse is not parse_vllm_metrics else "[]"
    with pytest.raises(LoadSignalError):
        parse(other if parse is not parse_llamacpp_slots else "<html>", 0.0)


def test_samples_are_summed_over_labels() -> None:
    text = ('vllm:num_requests_running{engine="0",model_name="a"} 2.0\n'
            'vllm:num_requests_running{engine="1",model_name="a"} 3.0\n'
            'vllm:num_requests_waiting{engine="0"} 1\n')
    snap = parse_vllm_metrics(text, 0.0)
    assert (snap.running, snap.waiting) == (5.0, 1.0)
