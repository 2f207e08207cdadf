"""Tool calls out of model text, incrementally: feed each new piece of a choice's text, get back
the content that may go out now and tool-call fragments (OpenAI's streamed shape: a call's id and
function name first, then pieces of its JSON arguments). The same parser serves streamed and
whole responses, so both say the same.

    parser = make_parser("hermes")        # per choice
    for text in pieces: pieces_out = parser.feed(text)
    pieces_out = parser.finish()          # what was held back; a call cut short ends as it is
    parser.num_calls                      # > 0: the choice finishes with "tool_calls"

Formats (a model's chat template teaches it one; `plugins.toml` picks the parser per backend):
- `hermes` (Hermes 2 Pro, Qwen 2.5/3, many ChatML tunes): `<tool_call>\\n{"name": "f",
  "arguments": {...}}\\n</tool_call>`, any number, text before them is content.
- `llama3_json` (Llama 3.1/3.2 JSON tool calling): the whole output is `{"name": "f",
  "parameters": {...}}` (optionally after `<|python_tag|>`, several separated by `;`); output that
  does not start with `{` is plain content.
Constrained forms the engine itself produces (no model format involved):
- `named`: the output *is* the arguments of the one function `tool_choice` names.
- `required`: the output is `[{"name": "f", "parameters": {...}}, ...]` (`required_calls_schema`).

Arguments stream as the model writes them (the raw JSON text of the value); a call whose JSON
does not have `name` first is sent whole when its object closes. Text that does not parse as a
call is returned as content.
"""

from __future__ import annotations

import json
import re
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal

ParserName = Literal["hermes", "llama3_json"]
PARSERS: tuple[str, ...] = ("hermes", "llama3_json")


@dataclass(frozen=True, slots=True)
class ToolCallPiece:
    """A fragment of call `tool_index`: `id` and `name` come with its first fragment only."""

    tool_index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


Piece = str | ToolCallPiece  # a str is content


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolParser(ABC):
    # a choice that made calls and ended by itself finishes with "tool_calls" (False: "stop",
    # vLLM's answer to a named tool_choice)
    calls_finish_as_tool_calls = True

    def __init__(self) -> None:
        self.num_calls = 0

    @abstractmethod
    def feed(self, text: str) -> list[Piece]:
        """Parse the next piece of output text."""

    @abstractmethod
    def finish(self) -> list[Piece]:
        """The output ended: whatever was held back."""


def make_parser(name: str) -> ToolParser:
    if name == "hermes":
        return HermesParser()
    if name == "llama3_json":
        return Llama3JsonParser()
    raise ValueError(f"unknown tool parser {name!r} (known: {', '.join(PARSERS)})")


def detect_parser(template_source: str | None) -> ParserName:
    """The format a chat template teaches, from its text: Llama 3's `<|python_tag|>` / ipython
    role means llama3_json, otherwise hermes (also the usual choice for ChatML models)."""
    source = template_source or ""
    if "<tool_call>" in source:
        return "hermes"
    if "<|python_tag|>" in source or "ipython" in source:
        return "llama3_json"
    return "hermes"


# ---- JSON scanning -------------------------------------------------------------------------------


class _JsonScan:
    """Where a JSON value ends, fed one piece at a time (strings and escapes respected)."""

    __slots__ = ("depth", "in_string", "escaped", "started", "done")

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.started = False
        self.done = False

    def feed(self, text: str) -> int | None:
        """Consume `text`; the index just past the value's end if it ends in `text`."""
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        self.done = True
                        return i + 1
                continue
            if not self.started and ch in " \t\r\n":
                continue
            self.started = True
            if ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    return i + 1
        return None


_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=[{\[])')


class _CallObject:
    """One `{"name": ..., "arguments"|"parameters": ...}` object, fed as it is written. When the
    name comes first, the header goes out as soon as it is complete and the arguments stream;
    otherwise the whole call goes out when the object closes (`close`)."""

    def __init__(self, tool_index: int) -> None:
        self.tool_index = tool_index
        self.text = ""
        self.scan = _JsonScan()  # the whole object
        self.args: _JsonScan | None = None  # the arguments value, once the header is out
        self.args_start = 0
        self.args_sent = 0  # characters of the arguments already out
        self.args_done = False

    @property
    def closed(self) -> bool:
        return self.scan.done

    @property
    def streaming(self) -> bool:
        return self.args is not None

    def feed(self, text: str) -> tuple[list[ToolCallPiece], str]:
        """Consume up to the object's end; (fragments, the text after the object)."""
        end = self.scan.feed(text)
        used, rest = (text, "") if end is None else (text[:end], text[end:])
        self.text += used
        out: list[ToolCallPiece] = []
        if self.args is None:
            m = _HEAD.match(self.text)
            if m is not None:
                self.args = _JsonScan()
                self.args_start = self.args_sent = m.end()
                out.append(ToolCallPiece(self.tool_index, "", new_call_id(), _unescape(m.group(1))))
        if self.args is not None and not self.args_done:
            fresh = self.text[self.args_sent:]
            stop = self.args.feed(fresh)
            if stop is not None:
                fresh = fresh[:stop]
                self.args_done = True
            if fresh:
                out.append(ToolCallPiece(self.tool_index, fresh))
            self.args_sent += len(fresh)
        return out, rest

    def close(self) -> list[ToolCallPiece] | None:
        """The output (or the call's block) ended. A call whose header never streamed is parsed
        whole: its one fragment, or None when it is no tool call (the text is content)."""
        if self.args is not None:
            return []
        try:
            obj = json.loads(self.text)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        return [ToolCallPiece(self.tool_index, args, new_call_id(), obj["name"])]


def _unescape(json_string_body: str) -> str:
    try:
        return json.loads(f'"{json_string_body}"')
    except ValueError:
        return json_string_body


def _held_prefix_len(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


# ---- model formats -------------------------------------------------------------------------------


class HermesParser(ToolParser):
    """`<tool_call>{json}</tool_call>` blocks inside otherwise plain content."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self) -> None:
        super().__init__()
        self.buffer = ""  # content held back (a possible start of <tool_call>) or the call's text
        self.call: _CallObject | None = None  # inside a block
        self.block = ""  # the block's raw text, for when it turns out not to be a call
        self.after_object = ""  # text between the object's end and </tool_call>

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        self.buffer += text
        while self.buffer:
            if self.call is None:
                start = self.buffer.find(self.OPEN)
                if start < 0:
                    keep = _held_prefix_len(self.buffer, self.OPEN)
                    self._content(out, self.buffer[: len(self.buffer) - keep])
                    self.buffer = self.buffer[len(self.buffer) - keep:]
                    break
                self._content(out, self.buffer[:start])
                self.buffer = self.buffer[start + len(self.OPEN):]
                self.call, self.block, self.after_object = _CallObject(self.num_calls), "", ""
                continue
            if not self._feed_block(out):
                break
        return out

    def _feed_block(self, out: list[Piece]) -> bool:
        """Feed the buffer into the open block; True when the block closed (more may follow)."""
        assert self.call is not None
        text, self.buffer = self.buffer, ""
        while not self.call.closed:
            cut = text.find(self.CLOSE)
            head = text if cut < 0 else text[:cut]
            pieces, rest = self.call.feed(head)
            self.block += head[: len(head) - len(rest)]
            out.extend(pieces)
            if self.call.closed:
                text = rest + text[len(head):]
                break
            if cut < 0:
                return False
            if not self.call.scan.in_string:  # the block ends before its object does
                text = text[cut:]
                break
            pieces, _ = self.call.feed(self.CLOSE)  # the tag's text inside a JSON string
            self.block += self.CLOSE
            out.extend(pieces)
            text = text[cut + len(self.CLOSE):]
        self.after_object += text
        end = self.after_object.find(self.CLOSE)
        if end < 0:
            keep = _held_prefix_len(self.after_object, self.CLOSE)
            self.after_object = self.after_object[len(self.after_object) - keep:]  # stray text dropped
            return False
        self.buffer = self.after_object[end + len(self.CLOSE):]
        self._end_block(out, closed=True)
        return True

    def _end_block(self, out: list[Piece], *, closed: bool) -> None:
        assert self.call is not None
        call, self.call = self.call, None
        whole = call.close()
        if whole is None:  # not a call after all: the block is content
            self._content(out, self.OPEN + self.block + (self.CLOSE if closed else ""))
        else:
            out.extend(whole)
            if call.streaming or whole:
                self.num_calls += 1

    def _content(self, out: list[Piece], text: str) -> None:
        if text and not (self.num_calls and not text.strip()):  # whitespace between calls is no content
            out.append(text)

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        if self.call is not None:
            self._end_block(out, closed=False)
        elif self.buffer:
            self._content(out, self.buffer)
        self.buffer = ""
        return out


class Llama3JsonParser(ToolParser):
    """Llama 3.1's JSON tool calls: the whole output is one or more call objects (`;` between),
    optionally after `<|python_tag|>`; anything else is content."""

    PYTHON_TAG = "<|python_tag|>"

    def __init__(self) -> None:
        super().__init__()
        self.mode: Literal["start", "calls", "content"] = "start"
        self.buffer = ""
        self.call: _CallObject | None = None
        self.failed = ""  # text of calls mode, kept in case it turns out not to be calls

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        if self.mode == "content":
            return [text] if text else []
        self.buffer += text
        if self.mode == "start":
            lead = self.buffer.lstrip()
            if lead.startswith(self.PYTHON_TAG):
                lead = lead[len(self.PYTHON_TAG):].lstrip()
            elif self.PYTHON_TAG.startswith(lead) and lead:
                return out  # may still become the tag
            if not lead:
                return out
            if not lead.startswith("{"):
                self.mode = "content"
                text, self.buffer = self.buffer, ""
                return [text]
            self.mode, self.buffer = "calls", lead
        while self.buffer:
            if self.call is None:
                lead = self.buffer.lstrip().lstrip(";").lstrip()
                if not lead:
                    self.buffer = ""
                    break
                if not lead.startswith("{"):  # trailing text after the calls: dropped as vLLM does
                    self.buffer = ""
                    break
                self.buffer = lead
                self.call = _CallObject(self.num_calls)
            pieces, rest = self.call.feed(self.buffer)
            out.extend(pieces)
            self.buffer = rest
            if not self.call.closed:
                break
            self._close(out)
        return out

    def _close(self, out: list[Piece]) -> None:
        assert self.call is not None
        call, self.call = self.call, None
        whole = call.close()
        if whole is None:
            out.append(call.text)
        else:
            out.extend(whole)
            self.num_calls += 1

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        if self.call is not None:
            self._close(out)
        elif self.mode == "start" and self.buffer:
            out.append(self.buffer)
        self.buffer = ""
        return out


# ---- constrained forms ---------------------------------------------------------------------------


class NamedCallParser(ToolParser):
    """`tool_choice` named a function: the whole output is its JSON arguments."""

    calls_finish_as_tool_calls = False

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        if not self.num_calls:
            self.num_calls = 1
            out.append(ToolCallPiece(0, "", new_call_id(), self.name))
        if text:
            out.append(ToolCallPiece(0, text))
        return out

    def finish(self) -> list[Piece]:
        return self.feed("") if not self.num_calls else []


class RequiredCallsParser(ToolParser):
    """`tool_choice: "required"`: the output is a JSON list of `{"name", "parameters"}` objects."""

    def __init__(self) -> None:
        super().__init__()
        self.buffer = ""
        self.call: _CallObject | None = None
        self.opened = False

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        self.buffer += text
        while self.buffer:
            if self.call is None:
                lead = self.buffer.lstrip()
                if not self.opened:
                    if not lead:
                        break
                    self.opened, lead = True, lead[1:]  # "[" (the grammar guarantees it)
                lead = lead.lstrip().lstrip(",").lstrip()
                if not lead.startswith("{"):
                    self.buffer = lead if not lead.startswith("]") else ""
                    break
                self.buffer = lead
                self.call = _CallObject(self.num_calls)
            pieces, rest = self.call.feed(self.buffer)
            out.extend(pieces)
            self.buffer = rest
            if not self.call.closed:
                break
            out.extend(self.call.close() or ())
            self.call = None
            self.num_calls += 1
        return out

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        if self.call is not None:
            out.extend(self.call.close() or ())
            if self.call.streaming or out:
                self.num_calls += 1
            self.call = None
        return out


def tool_parameters(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters schema; a function without one takes no arguments."""
    params = (tool.get("function") or {}).get("parameters")
    return params if isinstance(params, dict) else {"type": "object", "properties": {}}


def required_calls_schema(tools: list[dict[str, Any]], *, parallel: bool = True) -> dict[str, Any]:
    """The JSON schema of `tool_choice: "required"` output (as vLLM builds it): a non-empty list
    of calls, each a `{"name", "parameters"}` object of one of the tools."""
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t["function"]["name"]]},
                "parameters": tool_parameters(t),
            },
            "required": ["name", "parameters"],
        }
        for t in tools
    ]
    items: dict[str, Any] = variants[0] if len(variants) == 1 else {"anyOf": variants}
    schema: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema
