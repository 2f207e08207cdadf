"""What a request's structured output asks for, as a `GrammarSpec` to compile: read from vLLM's
`structured_outputs` or OpenAI's `response_format` (see `builtin_engine.text.structured`, which
compiles it). Plain data with no torch or xgrammar behind it, so the gateway's worker processes
build and check specs and the engine process compiles them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from builtin_engine.errors import InvalidRequestError

GrammarKind = Literal["json", "json_object", "regex", "choice", "grammar", "structural_tag"]


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """What to compile: `kind`, its canonical `source` text (a JSON schema as JSON, a regex, an
    EBNF/GBNF grammar, a JSON list of choices, a structural tag as JSON) and, for JSON, whether
    free whitespace is allowed. `param` names the request field, for errors."""

    kind: GrammarKind
    source: str = ""
    any_whitespace: bool = False
    param: str = field(default="structured_outputs", compare=False)

    @property
    def key(self) -> tuple[str, str, bool]:
        return (self.kind, self.source, self.any_whitespace)


def grammar_spec(structured_outputs: dict[str, Any] | None, response_format: dict[str, Any] | None) -> GrammarSpec | None:
    """The grammar a request asks for through vLLM's `structured_outputs` (json, regex, choice,
    grammar, json_object, structural_tag) or OpenAI's `response_format` (json_object,
    json_schema); None when it asks for none. Raises `InvalidRequestError` for what cannot be
    compiled here, naming the field."""
    so = structured_outputs or {}
    if so:
        if so.get("whitespace_pattern") is not None:
            raise InvalidRequestError("`structured_outputs.whitespace_pattern` is not supported by the built-in "
                                      "engine; use `disable_any_whitespace`.", param="structured_outputs.whitespace_pattern")
        any_ws = so.get("disable_any_whitespace") is False
        if so.get("json") is not None:
            return GrammarSpec("json", _schema_text(so["json"], "structured_outputs.json"), any_ws, "structured_outputs.json")
        if so.get("regex") is not None:
            return GrammarSpec("regex", so["regex"], param="structured_outputs.regex")
        if so.get("choice") is not None:
            choices = so["choice"]
            if not choices or not all(isinstance(c, str) for c in choices):
                raise InvalidRequestError("`structured_outputs.choice` must be a non-empty list of strings.",
                                          param="structured_outputs.choice")
            return GrammarSpec("choice", json.dumps(list(choices), ensure_ascii=False), param="structured_outputs.choice")
        if so.get("grammar") is not None:
            return GrammarSpec("grammar", so["grammar"], param="structured_outputs.grammar")
        if so.get("json_object"):
            return GrammarSpec("json_object", "", any_ws, "structured_outputs.json_object")
        if so.get("structural_tag") is not None:
            return GrammarSpec("structural_tag", so["structural_tag"], param="structured_outputs.structural_tag")
    rf = response_format or {}
    kind = rf.get("type", "text")
    if kind == "json_object":
        return GrammarSpec("json_object", "", param="response_format")
    if kind == "json_schema":
        schema = (rf.get("json_schema") or {}).get("schema")
        if schema is None:  # a name without a schema: any JSON object
            return GrammarSpec("json_object", "", param="response_format.json_schema")
        return GrammarSpec("json", _schema_text(schema, "response_format.json_schema.schema"),
                           param="response_format.json_schema.schema")
    return None


def json_schema_spec(schema: dict[str, Any], *, param: str) -> GrammarSpec:
    """A compact-JSON grammar for `schema` (tool arguments, tool-call lists)."""
    return GrammarSpec("json", _schema_text(schema, param), param=param)


def _schema_text(schema: Any, param: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise InvalidRequestError(f"`{param}` is not valid JSON: {exc}.", param=param) from None
    if not isinstance(schema, (dict, bool)):
        raise InvalidRequestError(f"`{param}` must be a JSON schema object.", param=param)
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))  # key order kept: it orders properties
