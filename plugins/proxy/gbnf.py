"""GBNF, the grammar language of llama.cpp's `grammar` field: vLLM's `structured_outputs.choice`
and `structured_outputs.regex` compiled into grammars llama-server enforces (`plugins.proxy.llamacpp`).

A regex is translated from Python's own parse tree (`re._parser`); what GBNF cannot say
(lookaround, backreferences, word boundaries, atomic groups, conditionals) is an `InvalidRequest`
naming it.
"""

from __future__ import annotations

import re
from typing import Any

from plugins.contract.errors import InvalidRequest


def _gbnf_literal(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def choice_grammar(choices: list[str]) -> str:
    """A GBNF grammar whose language is exactly `choices` (vLLM's `structured_outputs.choice`)."""
    if not choices:
        raise InvalidRequest("`structured_outputs.choice` must not be empty.", param="structured_outputs.choice")
    return "root ::= " + " | ".join(_gbnf_literal(str(c)) for c in choices)


def _gbnf_class_char(ch: str) -> str:
    if ch in "\\]^-[":
        return "\\" + ch
    if ch == "\n":
        return "\\n"
    if ch == "\r":
        return "\\r"
    if ch == "\t":
        return "\\t"
    if ord(ch) < 0x20 or ord(ch) == 0x7F:
        return f"\\x{ord(ch):02X}"
    return ch


_CATEGORIES = {"CATEGORY_DIGIT": "0-9", "CATEGORY_WORD": "a-zA-Z0-9_", "CATEGORY_SPACE": " \\t\\n\\r\\x0B\\x0C"}


def regex_grammar(regex: str) -> str:
    """A GBNF grammar matching exactly what `regex` fully matches (vLLM's
    `structured_outputs.regex`), translated from Python's regex parse tree; constructs GBNF
    cannot say (lookaround, backreferences, word boundaries) are a 400 naming them."""
    import re._constants as C  # noqa: N812 - the parser's opcodes
    import re._parser as P  # noqa: N812

    def fail(what: str) -> InvalidRequest:
        return InvalidRequest(f"`structured_outputs.regex` uses {what}, which backend llama.cpp's grammars cannot express.",
                              param="structured_outputs.regex")

    def klass(items: list[tuple[Any, Any]]) -> str:
        negate, parts = False, []
        for op, av in items:
            if op is C.NEGATE:
                negate = True
            elif op is C.LITERAL:
                parts.append(_gbnf_class_char(chr(av)))
            elif op is C.RANGE:
                parts.append(f"{_gbnf_class_char(chr(av[0]))}-{_gbnf_class_char(chr(av[1]))}")
            elif op is C.CATEGORY and str(av) in _CATEGORIES:
                parts.append(_CATEGORIES[str(av)])
            elif op is C.CATEGORY and len(items) == 1 and str(av).replace("NOT_", "") in _CATEGORIES:
                negate, parts = True, [_CATEGORIES[str(av).replace("NOT_", "")]]
            else:
                raise fail(f"the class item {op} {av}")
        return "[" + ("^" if negate else "") + "".join(parts) + "]"

    def seq(items: Any) -> str:
        out: list[str] = []
        run: list[str] = []  # consecutive literal characters, one GBNF string
        for op, av in list(items) + [(None, None)]:
            if op is C.LITERAL:
                run.append(chr(av))
                continue
            if run:
                out.append(_gbnf_literal("".join(run)))
                run = []
            if op is not None:
                out.append(item(op, av))
        out = [o for o in out if o]
        return out[0] if len(out) == 1 else "(" + " ".join(out) + ")" if out else '""'

    def item(op: Any, av: Any) -> str:
        if op is C.LITERAL:
            return _gbnf_literal(chr(av))
        if op is C.NOT_LITERAL:
            return "[^" + _gbnf_class_char(chr(av)) + "]"
        if op is C.ANY:
            return "."  # any character, as xgrammar (vLLM, the built-in engine) reads it
        if op is C.IN:
            return klass(list(av))
        if op is C.BRANCH:
            return "(" + " | ".join(seq(alt) for alt in av[1]) + ")"
        if op is C.SUBPATTERN:
            return seq(av[3])
        if op in (C.MAX_REPEAT, C.MIN_REPEAT, getattr(C, "POSSESSIVE_REPEAT", C.MAX_REPEAT)):
            lo, hi, sub = av
            inner = seq(sub)
            if not (inner[0] in '["(' or inner == "."):  # seq() gives one element: a group, class or literal
                inner = f"({inner})"
            if hi is C.MAXREPEAT or hi == C.MAXREPEAT:
                return inner + ("*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}")
            if (lo, hi) == (0, 1):
                return inner + "?"
            return inner + (f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}")
        if op is C.AT and str(av) in ("AT_BEGINNING", "AT_BEGINNING_STRING", "AT_END", "AT_END_STRING"):
            return ""  # the grammar matches the whole output anyway
        names = {"ASSERT": "lookahead", "ASSERT_NOT": "negative lookahead", "GROUPREF": "a backreference",
                 "AT": "a word boundary or anchor", "ATOMIC_GROUP": "an atomic group", "GROUPREF_EXISTS": "a conditional"}
        raise fail(names.get(str(op), str(op)))

    try:
        tree = P.parse(regex)
    except re.error as exc:
        raise InvalidRequest(f"`structured_outputs.regex` is not a valid regular expression: {exc}.",
                             param="structured_outputs.regex") from None
    return "root ::= " + seq(tree)
