"""The checks the battery runs, by name, in the order they were registered.

A check is one small async function `(probe) -> str` that returns what it saw when the backend
passed, raises `Failed` (with the traces that show why) when it did not, or `Skipped` when the
backend declares it cannot be asked (no tokenizer, no max_model_len...). Register one with
`@check(name, fix=...)`: its docstring's first line says what it checks, `fix` what to do about a
failure; `plugin-check`, the pytest plugin and README's verdict table all read them from here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from plugins.contract.errors import ConfigError

if TYPE_CHECKING:
    from plugins.testing.probe import Probe

CheckFn = Callable[["Probe"], Awaitable[str]]
Status = Literal["pass", "fail", "skip"]


class Skipped(Exception):
    """The check cannot be asked of this backend (it says why)."""


@dataclass(frozen=True)
class Check:
    name: str
    run: CheckFn
    summary: str  # what the check asks, one line
    fix: str  # what to change when it fails
    needs_model: bool = True  # skipped when the backend did not start or serves no model
    final: bool = False  # runs after every other check (it closes the backend)


@dataclass
class Verdict:
    check: str
    status: Status
    message: str
    seen: list[str] = field(default_factory=list)  # formatted event sequences behind a failure
    fix: str = ""
    elapsed_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status != "fail"


CHECKS: dict[str, Check] = {}


def check(name: str, *, fix: str, needs_model: bool = True, final: bool = False) -> Callable[[CheckFn], CheckFn]:
    def register(fn: CheckFn) -> CheckFn:
        if name in CHECKS:
            raise ValueError(f"two checks are named {name!r}")
        summary = (fn.__doc__ or name).strip().splitlines()[0]
        CHECKS[name] = Check(name=name, run=fn, summary=summary, fix=fix, needs_model=needs_model, final=final)
        return fn

    return register


def ordered(names: list[str] | None = None) -> list[Check]:
    """The checks to run (all, or those named), the final ones last."""
    if names:
        unknown = [n for n in names if n not in CHECKS]
        if unknown:
            raise ConfigError(f"unknown check(s) {', '.join(unknown)} (known: {', '.join(CHECKS)})")
    chosen = [c for c in CHECKS.values() if not names or c.name in names]
    return [c for c in chosen if not c.final] + [c for c in chosen if c.final]
