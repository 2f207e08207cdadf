"""`prefix_cache`: send a prompt where its prefix is already cached, unless that place is
overloaded; spread prompts that are cached nowhere.

0. A request of an agent session (`RequestSpec.session`) goes where the session's last turn
   went (`session_table`), unless that candidate's load exceeds the least-loaded one's by more
   than `load_margin` requests (or it cannot be tried). A new session — or one moved off an
   overloaded candidate — goes to the candidate, among those not overloaded, holding the fewest
   sessions (then the lower load, the longest prefix match, a rank hashed from the session and
   the candidate's name): sessions spread evenly, although they all share one long system
   prompt that would pull every new one onto the replica that saw it first. Steps 1-3 are for
   requests without a session.
1. The prompt's block hashes (`prefix_index.prompt_blocks`) are matched against each
   candidate's entries in the index: the longest run of leading blocks it holds.
2. A hit is a match of at least `min_match_ratio` of the prompt's blocks (at least one) — so
   that a short preamble every tenant shares does not pull every tenant onto the replica that
   saw it first. The longest hit wins unless its load exceeds the least-loaded candidate's by
   more than `load_margin` requests; among equal hits the lower load.
3. Otherwise (a miss, or every hit overloaded) the least-loaded candidate; among equally loaded
   ones the one holding the fewest cached blocks, so distinct prefixes spread over an idle
   fleet (after an overload: first the one holding most of the prefix, so spills gather);
   remaining ties go round the list.
4. The chosen candidate's entries take the prompt's blocks at once — before it answers — so
   requests with the same prefix that arrive together follow the first one, and are spread
   only when that replica is overloaded; a session's home moves to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from plugins.contract.protocol import RequestSpec
from plugins.fleet.balance.base import C, Choice, rotated
from plugins.fleet.balance.prefix_index import CHARS_PER_TOKEN, PrefixIndex, prompt_blocks
from plugins.fleet.balance.session_table import SessionTable, session_rank
from plugins.fleet.options import PrefixCacheOptions


class PrefixCache:
    def __init__(self, options: PrefixCacheOptions = PrefixCacheOptions()) -> None:
        self.options = options
        self.index = PrefixIndex(max_bytes=options.max_index_bytes, per_replica_blocks=self._blocks_for(options.replica_cache_tokens))
        self.sessions = SessionTable(options.max_sessions)
        self._turn = 0

    def _blocks_for(self, tokens: int | None) -> int | None:
        return None if tokens is None else max(1, tokens * CHARS_PER_TOKEN // self.options.block_chars)

    def choose(self, spec: RequestSpec, candidates: Sequence[C]) -> Choice[C]:
        self._turn += 1
        blocks = prompt_blocks(spec, self.options.block_chars)
        order = rotated(candidates, self._turn)
        loads = {c.name: c.load() for c in order}
        session = spec.session if self.options.max_sessions else None
        if session is None:
            chosen, reason = self._by_prefix(blocks, order, loads)
        else:
            chosen, reason = self._by_session(session, blocks, order, loads)
            self.sessions.went(session, chosen.name)
        # the engine's own cache size, when it tells it and `replica_cache_tokens` does not override it
        told = None if self.options.replica_cache_tokens is not None else chosen.cache_tokens()
        self.index.insert(chosen.name, blocks, capacity_blocks=self._blocks_for(told))
        return Choice(chosen, reason)

    def _by_session(self, session: str, blocks: list[int], order: list[C], loads: dict[str, float]) -> tuple[C, str]:
        """Where the session's last turn went, unless that replica is overloaded (or cannot be
        tried); else, as for a new session, the not overloaded candidate with the fewest
        sessions, then the lower load, then the longest prefix match, then the session's own
        rank (the same in every worker)."""
        home = self.sessions.home(session)
        least = min(loads.values())
        fresh = [c for c in order if loads[c.name] <= least + self.options.load_margin]
        for c in fresh:
            if c.name == home:
                return c, "session_hit"
        chosen = min(fresh, key=lambda c: (self.sessions.num_sessions(c.name), loads[c.name], -self.index.match(c.name, blocks),
                                           -session_rank(session, c.name)))
        return chosen, "session_new" if home is None else "session_moved"

    def _by_prefix(self, blocks: list[int], order: list[C], loads: dict[str, float]) -> tuple[C, str]:
        matches = {c.name: self.index.match(c.name, blocks) for c in order}
        least = min(loads.values())
        needed = max(1, math.ceil(self.options.min_match_ratio * len(blocks)))
        hits = [c for c in order if matches[c.name] >= needed]
        fresh = [c for c in hits if loads[c.name] <= least + self.options.load_margin]
        if fresh:
            chosen, reason = max(fresh, key=lambda c: (matches[c.name], -loads[c.name])), "prefix_hit"
        else:
            idle = [c for c in order if loads[c.name] == least]
            if hits:  # the prefix's home is overloaded: spill where an earlier spill went, if there
                chosen = min(idle, key=lambda c: (-matches[c.name], self.index.num_blocks(c.name)))
            else:
                chosen = min(idle, key=lambda c: self.index.num_blocks(c.name))
            reason = "prefix_overloaded" if hits else "prefix_miss"
        return chosen, reason

    def failed(self, spec: RequestSpec, name: str) -> None:
        self.index.remove(name, prompt_blocks(spec, self.options.block_chars))

    def forget(self, name: str) -> None:
        self.index.drop(name)
        self.sessions.drop(name)

    def cached_blocks(self, name: str) -> int:
        return self.index.num_blocks(name)
