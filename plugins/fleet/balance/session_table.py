"""The session table behind `prefix_cache` placement: where each agent session's last turn went.

An agent session (`RequestSpec.session`) resends one growing prompt every turn, so its next turn
belongs where its last one went: that replica holds the whole conversation in its KV cache,
including whatever the prefix index cannot see (an edited history, a prompt longer than the
index keeps). The table maps a session to that replica (a candidate's name), and counts each
replica's sessions so that new sessions spread evenly.

Bounded: at most `max_entries` sessions, the least recently used forgotten first (a forgotten
session is placed again as a new one: at worst one prefill). No clock, no TTL: a session idle
long enough to be forgotten by the engine is harmless here (its replica is still as good as any),
and the same trace gives the same table. Per process, like the prefix index: with several
workers (or gateways) each keeps its own; a new session's ties are broken by `session_rank`, so
that workers which saw the same sessions agree. A sticky route keyed on `session` is the
stateless alternative (rendezvous hashing: every worker agrees, whatever it saw).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

# What one entry costs at most (an OrderedDict entry and its linked node, a 36-character session
# id): ~176 bytes measured with tracemalloc, rounded up; 65,536 sessions (the default) ~12 MB.
ENTRY_BYTES = 256


class SessionTable:
    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._home: OrderedDict[str, str] = OrderedDict()
        self._count: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._home)

    def home(self, session: str) -> str | None:
        """The replica the session's last turn went to (None: a session not seen, or forgotten)."""
        return self._home.get(session)

    def num_sessions(self, replica: str) -> int:
        return self._count.get(replica, 0)

    def went(self, session: str, replica: str) -> None:
        """The session's turn went to `replica`: its home now, the most recently used."""
        if self.max_entries <= 0:
            return
        old = self._home.get(session)
        if old is not None:
            self._home.move_to_end(session)
            if old == replica:
                return
            self._count[old] -= 1
        self._home[session] = replica
        self._count[replica] = self._count.get(replica, 0) + 1
        while len(self._home) > self.max_entries:
            _, gone = self._home.popitem(last=False)
            self._count[gone] -= 1

    def drop(self, replica: str) -> None:
        """`replica` is gone for good: its sessions are new ones again."""
        for session in [s for s, r in self._home.items() if r == replica]:
            del self._home[session]
        self._count.pop(replica, None)


def session_rank(session: str, replica: str) -> int:
    """A stable pseudo-random rank of `replica` for `session` (rendezvous hashing): the tie-break
    between equally good homes for a new session, the same in every worker and gateway."""
    return int.from_bytes(hashlib.blake2b(f"{session}\x00{replica}".encode(), digest_size=8).digest(), "big")
