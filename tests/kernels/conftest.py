"""Kernel tests run every Triton kernel on the CPU in Triton's interpreter.

TRITON_INTERPRET=1 must be set before triton is first imported (its @jit decorator reads it
once), so it is set here, before anything below imports triton. If some earlier test module
already imported triton without it, the kernel tests cannot run and say so at once; setting
TRITON_INTERPRET=1 in the root tests/conftest.py (or the environment) fixes that.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for path in (str(ROOT), str(HERE)):  # `kernels` and this folder's helper module, any import mode
    if path not in sys.path:
        sys.path.insert(0, path)

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from kernels import norm  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

if not isinstance(norm._rms_norm_kernel, InterpretedFunction):
    raise pytest.UsageError(
        "triton was imported before tests/kernels/conftest.py set TRITON_INTERPRET=1; "
        "set it in the root tests/conftest.py or the environment so the kernel tests can run "
        "the Triton kernels on the CPU"
    )


@pytest.fixture(autouse=True)
def _fresh_backend_choice():
    """kernels caches its reading of SWITCHYARD_KERNELS: each test starts and ends without it."""
    import kernels

    kernels.reset_backend()
    yield
    kernels.reset_backend()


@pytest.fixture
def force_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """Route kernels.* calls to the Triton wrappers (interpreted on CPU tensors)."""
    import kernels

    monkeypatch.setenv("SWITCHYARD_KERNELS", "triton")
    kernels.reset_backend()
