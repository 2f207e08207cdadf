"""`call_in_own_thread`: the engine loads its model in a thread that ends with the load."""

from __future__ import annotations

import threading

import pytest

from builtin_engine.runner.cpu_threads import call_in_own_thread


def test_runs_in_another_thread_and_returns_its_result() -> None:
    caller = threading.get_ident()
    ident, name = call_in_own_thread(lambda: (threading.get_ident(), threading.current_thread().name), name="loader")
    assert ident != caller
    assert name == "loader"


def test_the_exception_reaches_the_caller() -> None:
    def fail() -> None:
        raise ValueError("bad checkpoint")

    with pytest.raises(ValueError, match="bad checkpoint"):
        call_in_own_thread(fail, name="loader")


def _env_after_import(env: dict[str, str]) -> str:
    import os
    import subprocess
    import sys

    base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    code = ("import os, builtin_engine, torch; "
            "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))")
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                          check=True, timeout=120).stdout.strip()


def test_importing_the_engine_caps_openmps_spin_before_torch_loads() -> None:
    from builtin_engine.runner.cpu_threads import OPENMP_SPIN_COUNT

    assert _env_after_import({}) == f"{OPENMP_SPIN_COUNT} None"


def test_a_wait_policy_the_user_set_is_kept() -> None:
    assert _env_after_import({"OMP_WAIT_POLICY": "ACTIVE"}) == "None ACTIVE"
    assert _env_after_import({"GOMP_SPINCOUNT": "5"}) == "5 None"
