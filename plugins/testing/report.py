"""Verdicts as text: one line per check, and under a failure its fix and the events it saw."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

from plugins.testing.registry import Verdict

MARKS = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP"}
WIDTH = 15
FIX_WIDTH = 110


def format_verdict(verdict: Verdict) -> str:
    lines = [f"{MARKS[verdict.status]}  {verdict.check:<{WIDTH}} {verdict.message} ({verdict.elapsed_s:.1f} s)"]
    if verdict.status == "fail":
        lines.append(textwrap.fill(verdict.fix, FIX_WIDTH, initial_indent=" " * 6 + "fix: ",
                                   subsequent_indent=" " * 11))
        for seen in verdict.seen:
            lines.append(textwrap.indent(seen, " " * 6))
    return "\n".join(lines)


def format_summary(verdicts: Iterable[Verdict]) -> str:
    verdicts = list(verdicts)
    counts = {status: sum(v.status == status for v in verdicts) for status in MARKS}
    return f"{len(verdicts)} checks: {counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped"
