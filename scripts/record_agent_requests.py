"""Record the requests the real coding-agent CLIs send, for the front-ends' tests (issue #32).

    python scripts/record_agent_requests.py                       # both CLIs, every scenario
    python scripts/record_agent_requests.py --cli codex --scenario bare
    python scripts/record_agent_requests.py --strace              # also list every connect() the CLI makes

A capture server on a free loopback port takes every request the CLI sends (method, path with
its query, headers, JSON body) and answers with a short but valid reply in the API's own wire
shape, so the CLI goes on and ends cleanly: Anthropic Messages SSE for Claude Code, typed
Responses API events ending in `response.completed` for Codex, 200 for probes of `/`. The CLI runs
non-interactively (engines/agents.py: `claude -p ... --output-format stream-json`, `codex exec
--json`) in a fresh home folder, so nothing of the user's own settings reaches the requests.

Scenarios, each a fresh home and working directory. All but `default` name the model as the
gateway serves it (`--model` / `model = ...`), as the end-to-end tests do; the CLIs shape some
fields by what they know of the model (Codex sends a model of its own catalogue its tools in
"code mode", as an `additional_tools` input item, and plain function tools otherwise):

    bare     the fewest tools (Claude Code: `--tools "" --system-prompt <short>`; Codex has no
             such flags: CODEX_FEWEST_TOOLS in its config)
    default  the CLI's default tools, system prompt and model (Claude Code picks its own model;
             Codex's config names none)
    model    default tools and system prompt
    tool     the first answer calls a read-only tool on a file in the working directory (Claude
             Code: Read; Codex: exec_command running `cat`), so the next request carries the call
             and its result
    resume   a second turn of the same session (`claude -p --continue`, `codex exec resume
             --last`): the second request resends the first turn

Each request is written to `tests/recordings/agents/<cli>-<version>-<scenario>-<n>.json`:

    {"cli", "cli_version", "scenario", "turn", "n", "method", "path", "headers": [[name, value]...],
     "body": <the JSON body, or null>, "body_text": <a body that is not JSON, else absent>,
     "reply": <what the capture server answered: "anthropic-sse", "responses-sse", ...>}

(a body sent compressed other than by gzip would be in "body_base64").

Header values of `authorization`, `x-api-key` and cookies are replaced by "<dropped>"; nothing
else is changed. Rerun after pinning a new CLI version (engines/install/agent_clis.py); stale
files of the old version are removed.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import http.server
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engines import agents, install  # noqa: E402

OUT = ROOT / "tests" / "recordings" / "agents"
SECRET_HEADERS = {"authorization", "x-api-key", "proxy-authorization", "cookie", "set-cookie"}
ANSWER = "Switchyard recorded this request."
TOOL_FILE = "switchyard.txt"
TOOL_FILE_TEXT = "trains wait on track 7\n"
GATEWAY_MODEL = "smollm2-135m-instruct"  # the model `make run` serves
SCENARIOS = ("bare", "default", "model", "tool", "resume")
CLIS = ("claude", "codex")
RUN_TIMEOUT_S = 240


# ------------------------------------------------------------------------------ replies


def _sse(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)


def anthropic_reply(body: dict[str, Any], n: int, *, tool_call: dict[str, Any] | None) -> tuple[str, bytes]:
    """A Messages answer: `tool_call` ({"name", "input"}) as a tool_use block, else ANSWER."""
    model = body.get("model", "claude")
    usage = {"input_tokens": 12, "output_tokens": 6, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}
    if tool_call is not None:
        block = {"type": "tool_use", "id": f"toolu_rec{n:04d}", "name": tool_call["name"], "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": json.dumps(tool_call["input"])}]
        final = {**block, "input": tool_call["input"]}
        stop = "tool_use"
    else:
        block = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": ANSWER}]
        final = {"type": "text", "text": ANSWER}
        stop = "end_turn"
    message = {"id": f"msg_rec{n:04d}", "type": "message", "role": "assistant", "model": model, "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": {**usage, "output_tokens": 1}}
    if not body.get("stream"):
        whole = {**message, "content": [final], "stop_reason": stop, "usage": usage}
        return "application/json", json.dumps(whole).encode()
    events = [("message_start", {"type": "message_start", "message": message}),
              ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
              ("ping", {"type": "ping"})]
    events += [("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d}) for d in deltas]
    events += [("content_block_stop", {"type": "content_block_stop", "index": 0}),
               ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                  "usage": usage}),
               ("message_stop", {"type": "message_stop"})]
    return "text/event-stream", _sse(events)


def responses_reply(body: dict[str, Any], n: int, *, tool_call: dict[str, Any] | None) -> tuple[str, bytes]:
    """A Responses API stream: `tool_call` ({"name", "arguments"}) as a function_call item, else ANSWER."""
    rid, created = f"resp_rec{n:04d}", int(time.time())
    base = {"id": rid, "object": "response", "created_at": created, "model": body.get("model", "gpt"),
            "output": [], "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)), "tools": [],
            "tool_choice": "auto", "store": False, "metadata": {}, "error": None, "incomplete_details": None}
    if tool_call is not None:
        item = {"type": "function_call", "id": f"fc_rec{n:04d}", "call_id": f"call_rec{n:04d}",
                "name": tool_call["name"], "arguments": tool_call["arguments"], "status": "completed"}
        item_events = [("response.output_item.added", {"output_index": 0, "item": {**item, "arguments": "",
                                                                                  "status": "in_progress"}}),
                       ("response.function_call_arguments.delta", {"item_id": item["id"], "output_index": 0,
                                                                   "delta": item["arguments"]}),
                       ("response.function_call_arguments.done",
                        {"item_id": item["id"], "output_index": 0, "name": item["name"],
                         "arguments": item["arguments"]}),
                       ("response.output_item.done", {"output_index": 0, "item": item})]
    else:
        part = {"type": "output_text", "text": ANSWER, "annotations": [], "logprobs": []}
        item = {"type": "message", "id": f"msg_rec{n:04d}", "role": "assistant", "status": "completed",
                "content": [part]}
        ids = {"item_id": item["id"], "output_index": 0, "content_index": 0}
        item_events = [("response.output_item.added", {"output_index": 0, "item": {**item, "content": [],
                                                                                  "status": "in_progress"}}),
                       ("response.content_part.added", {**ids, "part": {**part, "text": ""}}),
                       ("response.output_text.delta", {**ids, "delta": ANSWER, "logprobs": []}),
                       ("response.output_text.done", {**ids, "text": ANSWER, "logprobs": []}),
                       ("response.content_part.done", {**ids, "part": part}),
                       ("response.output_item.done", {"output_index": 0, "item": item})]
    usage = {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 6,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 18}
    events = [("response.created", {"response": {**base, "status": "in_progress"}}),
              ("response.in_progress", {"response": {**base, "status": "in_progress"}}),
              *item_events,
              ("response.completed", {"response": {**base, "status": "completed", "output": [item],
                                                   "usage": usage, "completed_at": int(time.time())}})]
    return "text/event-stream", _sse([(name, {"type": name, "sequence_number": i, **data})
                                      for i, (name, data) in enumerate(events)])


# ------------------------------------------------------------------------------ capture server


@dataclass
class Capture:
    """What one scenario's server saw, and how it answers the next request."""

    tool_call: Callable[[dict[str, Any]], dict[str, Any] | None] = lambda body: None
    records: list[dict[str, Any]] = field(default_factory=list)
    turn: int = 1
    lock: threading.Lock = field(default_factory=threading.Lock)


class CaptureHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: CaptureServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass

    def _handle(self) -> None:
        raw = self._read_body()
        capture = self.server.capture
        with capture.lock:
            n = len(capture.records) + 1
            record: dict[str, Any] = {
                "turn": capture.turn, "n": n, "method": self.command, "path": self.path,
                "headers": [[k, "<dropped>" if k.lower() in SECRET_HEADERS else v] for k, v in self.headers.items()],
                "body": None,
            }
            if raw and self.headers.get("content-encoding", "identity") not in ("identity", "gzip"):
                record["body_base64"] = base64.b64encode(raw).decode()  # (neither CLI compressed here)
            elif raw:
                try:
                    record["body"] = json.loads(raw)
                except ValueError:
                    record["body_text"] = raw.decode("utf-8", "replace")
            capture.records.append(record)
        status, content_type, payload, kind = self._reply(record, n)
        record["reply"] = kind
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(payload)))
        if content_type == "text/event-stream":
            self.send_header("cache-control", "no-cache")
        self.send_header("request-id", f"req_rec{n:04d}")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)
            self.wfile.flush()

    def _read_body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            raw = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                raw += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
        else:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        return gzip.decompress(raw) if raw and self.headers.get("content-encoding") == "gzip" else raw

    def _reply(self, record: dict[str, Any], n: int) -> tuple[int, str, bytes, str]:
        path = self.path.split("?", 1)[0].rstrip("/")
        body = record["body"] if isinstance(record["body"], dict) else {}
        if self.command == "HEAD" or (self.command == "GET" and path in ("", "/v1")):
            return 200, "text/plain", b"ok", "probe-200"  # Claude Code: `HEAD /api/hello` (a reachability probe)
        if self.command == "POST" and path.endswith("/messages/count_tokens"):
            return 200, "application/json", json.dumps({"input_tokens": 12}).encode(), "anthropic-count-tokens"
        if self.command == "POST" and path.endswith("/messages"):
            content_type, payload = anthropic_reply(body, n, tool_call=self.server.capture.tool_call(body))
            return 200, content_type, payload, "anthropic-sse" if body.get("stream") else "anthropic-json"
        if self.command == "POST" and path.endswith("/responses"):
            content_type, payload = responses_reply(body, n, tool_call=self.server.capture.tool_call(body))
            return 200, content_type, payload, "responses-sse"
        if self.command == "GET" and path.endswith("/models"):
            empty = {"object": "list", "data": [], "models": []}  # OpenAI's list; Codex's own shape
            return 200, "application/json", json.dumps(empty).encode(), "models-empty"
        error = {"error": {"type": "not_found_error", "message": f"the capture server has no {self.command} {path}"}}
        return 404, "application/json", json.dumps(error).encode(), "404"

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _handle


class CaptureServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, capture: Capture) -> None:
        super().__init__(("127.0.0.1", 0), CaptureHandler)
        self.capture = capture
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> CaptureServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


# ------------------------------------------------------------------------------ scenarios


def _anthropic_has_tool_result(body: dict[str, Any]) -> bool:
    return any(isinstance(block, dict) and block.get("type") == "tool_result"
               for message in body.get("messages", []) if isinstance(message.get("content"), list)
               for block in message["content"])


def _tool_names(body: dict[str, Any]) -> set[str]:
    names = set()
    for tool in body.get("tools") or []:
        names.add(tool.get("name") or (tool.get("function") or {}).get("name"))
        for inner in tool.get("tools") or []:  # Codex's `namespace` tools
            names.add(inner.get("name"))
    return names


def claude_tool_call(workdir: Path) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    def decide(body: dict[str, Any]) -> dict[str, Any] | None:
        if "Read" in _tool_names(body) and not _anthropic_has_tool_result(body):
            return {"name": "Read", "input": {"file_path": str(workdir / TOOL_FILE)}}
        return None
    return decide


def codex_tool_call(body: dict[str, Any]) -> dict[str, Any] | None:
    items = body.get("input") if isinstance(body.get("input"), list) else []
    if any(item.get("type") == "function_call_output" for item in items):
        return None
    names = _tool_names(body)
    for name, arguments in (("exec_command", {"cmd": f"cat {TOOL_FILE}"}),
                            ("shell_command", {"command": f"cat {TOOL_FILE}"}),
                            ("shell", {"command": ["cat", TOOL_FILE]})):
        if name in names:
            return {"name": name, "arguments": json.dumps(arguments)}
    return None


@dataclass
class Turn:
    argv: list[str]
    env: dict[str, str]
    returncode: int
    stdout: str
    stderr: str
    connects: list[str]


def _run(command: agents.AgentCommand, workdir: Path, *, strace: bool) -> Turn:
    argv = command.argv
    trace = workdir.parent / f"strace-{time.monotonic_ns()}.txt"
    if strace:
        argv = ["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace), *argv]
    out = subprocess.run(argv, env=command.env, cwd=workdir, capture_output=True, text=True,
                         timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    connects = []
    if strace and trace.is_file():
        connects = sorted({m.group(0) for m in re.finditer(r'sa_family=AF_INET6?, [^}]*\}', trace.read_text())})
        connects += sorted({m.group(0) for m in re.finditer(r'sa_family=AF_UNIX, [^}]*\}', trace.read_text())})
    return Turn(command.argv, command.env, out.returncode, out.stdout, out.stderr, connects)


def run_scenario(cli: str, scenario: str, *, strace: bool) -> tuple[list[dict[str, Any]], list[Turn]]:
    tmp = Path(tempfile.mkdtemp(prefix=f"switchyard-{cli}-{scenario}-"))
    try:
        home, workdir = tmp / "home", tmp / "work"
        home.mkdir()
        workdir.mkdir()
        (workdir / TOOL_FILE).write_text(TOOL_FILE_TEXT, encoding="utf-8")
        capture = Capture()
        if scenario == "tool":
            capture.tool_call = claude_tool_call(workdir) if cli == "claude" else codex_tool_call
        prompts = {"tool": [f"What does {TOOL_FILE} say?"], "resume": ["Name a colour.", "And another one?"]}
        prompts = prompts.get(scenario, ["Name a colour."])
        model = None if scenario == "default" else GATEWAY_MODEL
        turns = []
        with CaptureServer(capture) as server:
            for i, prompt in enumerate(prompts, start=1):
                capture.turn = i
                if cli == "claude":
                    bare = {"tools": [], "system_prompt": "You are a terse assistant."} if scenario == "bare" else {}
                    command = agents.claude_command(prompt, base_url=server.url, home=home, model=model,
                                                    resume=i > 1, max_turns=4, **bare)
                else:
                    command = agents.codex_command(prompt, base_url=f"{server.url}/v1", home=home, model=model,
                                                   resume=i > 1, fewest_tools=scenario == "bare")
                turns.append(_run(command, workdir, strace=strace))
        return capture.records, turns
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_records(cli: str, version: str, scenario: str, records: list[dict[str, Any]]) -> list[Path]:
    OUT.mkdir(parents=True, exist_ok=True)
    for stale in OUT.glob(f"{cli}-*-{scenario}-*.json"):
        stale.unlink()
    written = []
    for record in records:
        path = OUT / f"{cli}-{version}-{scenario}-{record['n']}.json"
        data = {"cli": cli, "cli_version": version, "scenario": scenario, **record}
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cli", choices=CLIS, action="append", help="default: both")
    parser.add_argument("--scenario", choices=SCENARIOS, action="append", help="default: all")
    parser.add_argument("--strace", action="store_true", help="list the addresses each CLI connect()s to")
    parser.add_argument("--dry-run", action="store_true", help="print the requests' summary, write nothing")
    args = parser.parse_args(argv)
    missing = [cli.key for cli in install.AGENT_CLIS if not install.agent_installed(cli)]
    if missing:
        print(f"not installed: {', '.join(missing)}; run `python -m engines.install agents`", file=sys.stderr)
        return 1
    versions = {"claude": agents.version(install.CLAUDE_CODE), "codex": agents.version(install.CODEX)}
    failed = False
    for cli in args.cli or CLIS:
        for scenario in args.scenario or SCENARIOS:
            records, turns = run_scenario(cli, scenario, strace=args.strace)
            print(f"== {cli} {versions[cli]} {scenario}: {len(records)} requests")
            for record in records:
                body = record["body"] if isinstance(record["body"], dict) else {}
                print(f"   turn {record['turn']} #{record['n']} {record['method']} {record['path']} "
                      f"-> {record.get('reply')}  model={body.get('model')} keys={sorted(body)}")
            for i, turn in enumerate(turns, start=1):
                status = "ok" if turn.returncode == 0 else f"exit {turn.returncode}"
                print(f"   turn {i}: {status}; stdout {len(turn.stdout)} chars; stderr: {turn.stderr.strip()[-600:]!r}")
                if args.strace:
                    print(f"   turn {i} connect(): {turn.connects}")
                failed |= turn.returncode != 0
            if not args.dry_run and records:
                for path in write_records(cli, versions[cli], scenario, records):
                    print(f"   wrote {path.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
