"""Stand-ins for `triton` and `triton.language` when triton is not installed.

The kernel files import triton inside `try`; on a CPU-only install they fall back to these names
so the `@triton.jit` definitions still parse and the torch references stay importable. Launching
a kernel then raises a clear error instead of an AttributeError deep inside a wrapper.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable


class MissingKernel:
    """What `triton.jit` returns without triton: keeps the source function, refuses to launch."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __getitem__(self, grid: Any) -> Any:
        raise ModuleNotFoundError(
            f"kernel {self.fn.__name__} needs the `triton` package; install it or set "
            "SWITCHYARD_KERNELS=torch"
        )


def _jit(fn: Callable[..., Any] | None = None, **_options: Any) -> Any:
    if fn is None:
        return lambda f: MissingKernel(f)
    return MissingKernel(fn)


triton = SimpleNamespace(jit=_jit)
tl = SimpleNamespace(constexpr=object)
