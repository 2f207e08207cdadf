"""The values behind prometheus-client's metrics under several worker processes: each process
writes its samples into its own files in `PROMETHEUS_MULTIPROC_DIR`, in prometheus-client's file
format (`MmapedDict`), which its `MultiProcessCollector` reads at scrape time.

prometheus-client's own `MultiProcessValue` asks for the process id on every increment, to notice
a fork, and goes through four Python calls to write the two doubles of a sample. Here a fork is
noticed once, by an `os.register_at_fork` hook (the child then writes files of its own, starting
from what they hold), and an increment is one locked add and one `struct.pack_into` at the
sample's position, which never moves once the key is in the file (0.59 -> 0.33 us an increment,
~13 increments a request).
"""

from __future__ import annotations

import os
import struct
import threading
from typing import Any

from prometheus_client.mmap_dict import MmapedDict, mmap_key

_pack_two_doubles = struct.Struct("dd").pack_into


def mmap_value_class() -> type:
    """A `prometheus_client.values.ValueClass` for multiprocess mode. Install it before the
    first metric of the process is made; `PROMETHEUS_MULTIPROC_DIR` must be set."""
    files: dict[str, MmapedDict] = {}
    values: list[MmapValue] = []
    lock = threading.Lock()  # (threads of one process may write the same file)
    pid = os.getpid()

    def forked() -> None:  # in the child: its own files, from what they hold (nothing yet)
        nonlocal pid
        pid = os.getpid()
        for file in files.values():
            file.close()
        files.clear()
        for value in values:
            value._open()

    os.register_at_fork(after_in_child=forked)

    class MmapValue:
        """A sample's value, kept here and written into this process's file at each change."""

        _multiprocess = True

        def __init__(self, typ: str, metric_name: str, name: str, labelnames: Any, labelvalues: Any, help_text: str,
                     multiprocess_mode: str = "", **kwargs: Any) -> None:
            self._params = typ, metric_name, name, labelnames, labelvalues, help_text, multiprocess_mode
            with lock:
                self._open()
                values.append(self)

        def _open(self) -> None:
            typ, metric_name, name, labelnames, labelvalues, help_text, mode = self._params
            prefix = f"{typ}_{mode}" if typ == "gauge" else typ
            file = files.get(prefix)
            if file is None:
                path = os.path.join(os.environ["PROMETHEUS_MULTIPROC_DIR"], f"{prefix}_{pid}.db")
                file = files[prefix] = MmapedDict(path)
            self._file = file
            key = mmap_key(metric_name, name, labelnames, labelvalues, help_text)
            self._value = file.read_value(key)[0]  # (adds the key to the file when it is new)
            self._pos = file._positions[key]

        def inc(self, amount: float) -> None:
            with lock:
                self._value += amount
                _pack_two_doubles(self._file._m, self._pos, self._value, 0.0)

        def set(self, value: float, timestamp: float | None = None) -> None:
            with lock:
                self._value = value
                _pack_two_doubles(self._file._m, self._pos, value, timestamp or 0.0)

        def set_exemplar(self, exemplar: Any) -> None:  # (multiprocess mode has no exemplars)
            return

        def get(self) -> float:
            with lock:
                return self._value

        def get_exemplar(self) -> None:
            return None

    return MmapValue
