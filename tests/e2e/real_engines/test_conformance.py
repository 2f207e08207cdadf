"""The conformance battery (`plugins.testing`) against Switchyard's own backends, each in front of
the real thing: the built-in engine with the default model (in process, and in an engine process
of its own: every event and embedding crosses ZeroMQ), vLLM and llama.cpp (the session's
servers), and `openai_compatible` pointed at the vLLM server. One test per backend and check; and the
reasoning rules against the built-in engine when its reasoning parser turns the output into thinking."""

from __future__ import annotations

import asyncio
import re

import pytest

from engines.launch import ServerProcess
from switchyard.testing import Subject, run_battery
from tests.e2e.real_engines.conftest import CONTEXT, MODEL, public_name

BACKENDS = ("builtin", "builtin_engine_process", "vllm", "llamacpp", "openai_compatible")
UPSTREAM = {"vllm": "vllm", "llamacpp": "llamacpp", "openai_compatible": "vllm"}
TYPES = {"builtin_engine_process": "builtin"}


def options(backend: str, servers: dict[str, ServerProcess]) -> dict:
    if backend == "builtin":
        return {"model": MODEL, "max_model_len": CONTEXT, "num_threads": 1}
    if backend == "builtin_engine_process":
        return {**options("builtin", servers), "engine_process": True}
    upstream = UPSTREAM[backend]
    if upstream not in servers:
        pytest.skip(f"{upstream} is not installed")
    base = {"base_url": servers[upstream].base_url}
    if backend == "openai_compatible":  # a server that honours top_k and no tool calls (no --enable-auto-tool-choice)
        return {**base, "extensions": ["top_k"], "tools": False}
    return {**base, "models": {public_name(backend): MODEL}}


@pytest.fixture(scope="module", params=BACKENDS)
def switchyard_subject(request: pytest.FixtureRequest, engine_servers: dict[str, ServerProcess]) -> Subject:
    kind = TYPES.get(request.param, request.param)
    return Subject.of_type(kind, options(request.param, engine_servers), name=request.param)


def test_conformance(switchyard_battery, switchyard_check: str) -> None:  # noqa: ANN001
    switchyard_battery.assert_passes(switchyard_check)


def test_reasoning_deltas_keep_the_grammar_and_are_counted() -> None:
    """`deepseek_r1` without a `</think>` reads the whole output as reasoning: every stream is
    ReasoningDeltas, and Usage.reasoning_tokens must count them."""
    subject = Subject.of_type("builtin", {**options("builtin", {}), "reasoning_parser": "deepseek_r1"},
                              name="builtin-reasoning")
    verdicts = asyncio.run(run_battery(subject, ["event_grammar", "usage"]))
    assert [(v.check, v.status) for v in verdicts] == [("event_grammar", "pass"), ("usage", "pass")], verdicts
    assert re.search(r"chat \d+ = tokenize\(\) \(reasoning (\d+) of \1\)", verdicts[1].message), verdicts[1].message
