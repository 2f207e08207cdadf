"""The real Codex CLI (`codex exec --json`, pinned in engines/install.py) against a Switchyard
gateway on a free loopback port, configured as the README's "Coding agents" says:

(a) its fewest tools and a short prompt, the built-in engine: an answer;
(b) its default tools, model and system prompt, the built-in engine at a context the prompt
    does not fit: the clear context error, shown by the CLI;
(c) tool round trips through the scripted test backend: a `function` call (`exec_command`),
    a `custom` tool inside a `namespace` in code mode (`functions.exec`, JavaScript that runs
    the command) and a plain function of a namespace (`clock.sleep`), each tool output going
    back to the model;
(d) a session whose second turn overflows the context: the third turn compacts first, as
    Codex does after OpenAI's `context_length_exceeded`.

Never a hang, a 5xx, or a 400 on a field the gateway accepts: each run is timed out, and the
gateway's request log says how each request was answered.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engines import agents, install
from tests.support import agent_recordings
from tests.support.probes import wait_until
from tests.support.server import running_server

pytestmark = pytest.mark.skipif(not install.agent_installed(install.CODEX),
                                reason="Codex is not installed; run `python -m engines.install agents`")

NAMED = "smollm2-135m-instruct"
DEFAULT = agent_recordings.load("codex", "default")[0].body["model"]  # what Codex picks without `model`
CONTEXT_ERROR = "ran out of room in the model's context window"
RUN_TIMEOUT_S = 300
FILE_TEXT = "trains wait on track 7"


@dataclass
class Run:
    returncode: int
    events: list[dict]
    stderr: str

    def items(self, kind: str) -> list[dict]:
        return [e["item"] for e in self.events if e["type"] == "item.completed" and e["item"]["type"] == kind]

    @property
    def answer(self) -> str:
        return "".join(item["text"] for item in self.items("agent_message"))

    @property
    def ended(self) -> str:
        return next(e["type"] for e in reversed(self.events) if e["type"].startswith("turn."))


def codex(base: str, home: Path, prompt: str, *, model: str | None = NAMED, fewest_tools: bool = False,
          resume: bool = False) -> Run:
    work = home / "work"
    work.mkdir(parents=True, exist_ok=True)
    (work / "switchyard.txt").write_text(FILE_TEXT + "\n")
    command = agents.codex_command(prompt, base_url=base + "/v1", home=home, model=model, fewest_tools=fewest_tools,
                                   resume=resume)
    done = subprocess.run(command.argv, env=command.env, cwd=work, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return Run(done.returncode, events, done.stderr)


def logged(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def assert_no_bad_answers(log: Path) -> None:
    """No 5xx, and no 400 but a prompt too long, in the gateway's request log."""
    for entry in logged(log):
        assert entry["outcome"] == "ok" or (entry.get("error") or "").endswith("context_length_exceeded"), entry


def server_config(tmp: Path, backend: str, *, default_max_tokens: int = 256, **options: object) -> str:
    lines = [f'[server]\nrequest_log = "{tmp}/requests.jsonl"\nlog_prompts = true\ndefault_max_tokens = {default_max_tokens}\n',
             f'[responses]\nsqlite_path = "{tmp}/responses.sqlite3"\nreasoning_key_file = "{tmp}/reasoning.key"\n']
    if backend == "script":
        lines.append('[plugins]\ndisable = ["builtin"]\nmodules = ["tests.support.script_backend"]\n')
    lines.append(f'[[backends]]\nname = "{backend}"\ntype = "{backend}"\n[backends.options]')
    lines += [f"{key} = {json.dumps(value)}" for key, value in options.items()]
    if backend == "builtin":  # Codex's own model name, served by the same engine
        lines.append(f'\n[[routes]]\nname = "{DEFAULT}"\n[[routes.targets]]\nbackend = "builtin"\nmodel = "{NAMED}"')
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def builtin(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The built-in engine at 6,144 tokens: Codex's fewest-tools prompt (~4,600 tokens) fits,
    its default code-mode prompt (~7,150) does not."""
    tmp = tmp_path_factory.mktemp("codex-builtin")
    config = server_config(tmp, "builtin", default_max_tokens=48, model=NAMED, max_model_len=6144, num_threads=1)
    with running_server(config, tmp) as base:
        yield base, tmp / "requests.jsonl"


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("codex-script")
    with running_server(server_config(tmp, "script", models=[NAMED, DEFAULT], max_model_len=100_000), tmp) as base:
        yield base, tmp / "requests.jsonl"


@pytest.mark.slow
def test_a_short_prompt_gets_an_answer(builtin: tuple[str, Path], tmp_path: Path) -> None:
    base, log = builtin
    run = codex(base, tmp_path, "Name a colour.", fewest_tools=True)
    assert run.answer.strip(), run.events
    # the answer either ends, or runs into the route's output cap, which Codex reports in its words
    if run.ended != "turn.completed":
        assert run.events[-1]["error"]["message"] == "Incomplete response returned, reason: max_output_tokens", run.events
    assert wait_until(lambda: any(e["route"] == NAMED for e in logged(log)))
    assert [e["outcome"] for e in logged(log) if e["route"] == NAMED] == ["ok"]


@pytest.mark.slow
def test_default_tools_and_prompt_get_the_clear_context_error(builtin: tuple[str, Path], tmp_path: Path) -> None:
    base, log = builtin
    run = codex(base, tmp_path, "Name a colour.", model=None)
    assert run.returncode == 1 and run.ended == "turn.failed"
    assert CONTEXT_ERROR in run.events[-1]["error"]["message"]
    assert wait_until(lambda: any(e["route"] == DEFAULT for e in logged(log)))
    (served,) = [e for e in logged(log) if e["route"] == DEFAULT]
    assert served["error"] == "context_length_exceeded" and served["attempts"] == [
        {"backend": "builtin", "outcome": "context_length_exceeded"}]
    assert_no_bad_answers(log)


@pytest.mark.parametrize(("model", "prompt", "shown"), [
    (NAMED, 'CALLJSON exec_command {"cmd": "cat switchyard.txt"}', FILE_TEXT),
    (None, 'CALLJSON functions__exec {"input": "text(await tools.exec_command({cmd: \\"cat switchyard.txt\\"}));"}',
     FILE_TEXT),
    (None, 'CALLJSON clock__sleep {"duration_ms": 5}', "Sleep completed"),
], ids=["function", "namespaced-custom", "namespaced-function"])
def test_tool_round_trip(script: tuple[str, Path], tmp_path: Path, model: str | None, prompt: str, shown: str) -> None:
    base, log = script
    run = codex(base, tmp_path, prompt, model=model)
    assert run.ended == "turn.completed", run.events
    if shown == FILE_TEXT:  # Codex ran the command the call asked for
        (command,) = run.items("command_execution")
        assert command["command"].endswith("'cat switchyard.txt'") and command["aggregated_output"] == FILE_TEXT + "\n"
    assert run.answer.startswith("result: ") and shown in run.answer  # the tool output reached the model
    name = prompt.split()[1]  # the model's (flat) name of the tool: what the gateway gave it

    def answered() -> list[list[dict]]:
        return [e["prompt"] for e in logged(log) if e["prompt"][-1]["role"] == "tool" and shown in e["prompt"][-1]["content"]
                and e["prompt"][-2].get("tool_calls", [{}])[0].get("function", {}).get("name") == name]

    assert wait_until(lambda: bool(answered()), timeout=10), logged(log)[-3:]
    call, result = answered()[-1][-2:]
    assert call["role"] == "assistant" and result["tool_call_id"] == call["tool_calls"][0]["id"]
    assert_no_bad_answers(log)


def test_a_context_overflow_makes_the_next_turn_compact(tmp_path: Path) -> None:
    """Turn 1 fits (~3,100 words), turn 2 (2,000 more) does not: a 400 `context_length_exceeded`,
    which Codex shows; turn 3 compacts the conversation before anything else."""
    tmp = tmp_path / "gateway"
    tmp.mkdir()
    with running_server(server_config(tmp, "script", models=[NAMED], max_model_len=4500), tmp) as base:
        home = tmp_path / "home"
        first = codex(base, home, "Name a colour.", fewest_tools=True)
        assert first.ended == "turn.completed"
        second = codex(base, home, "Read this: " + " ".join(["pad"] * 2000), fewest_tools=True, resume=True)
        assert second.ended == "turn.failed" and CONTEXT_ERROR in second.events[-1]["error"]["message"]
        codex(base, home, "And a third?", fewest_tools=True, resume=True)
        log = tmp / "requests.jsonl"
        assert wait_until(lambda: any(_asks(e, "And a third?") for e in logged(log)), timeout=10)
    entries = logged(log)
    compacting = [i for i, e in enumerate(entries) if _asks(e, "CONTEXT CHECKPOINT COMPACTION")]
    third = min(i for i, e in enumerate(entries) if _asks(e, "And a third?"))
    overflowed = [i for i, e in enumerate(entries) if _asks(e, "Read this: pad")]
    assert overflowed and compacting, entries
    assert overflowed[0] < compacting[0] < third  # the overflow, then compaction before the turn itself
    assert any(entries[i]["outcome"] == "ok" for i in compacting)
    assert_no_bad_answers(log)


def _asks(entry: dict, text: str) -> bool:
    """The request's last message holds `text`."""
    return text in json.dumps(entry["prompt"][-1])
