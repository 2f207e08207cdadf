"""`call_in_own_thread`: the engine loads its model in a thread that ends with the load."""

from __future__ import annotations

import threading

import pytest

from builtin_engine.cpu_threads import call_in_own_thread


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
