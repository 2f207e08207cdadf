"""The approximate prefix index behind `prefix_cache` placement: which replica was sent which
prompt prefixes.

A prompt is cut into fixed-size blocks (characters of a canonical rendering of the messages;
token ids for a prompt given as ids) and each block is named by a 64-bit hash of the whole prompt
up to its end, so a block's name says its entire prefix. Per replica an LRU of block names
mirrors what that replica's engine keeps: a request's blocks are touched last-to-first, so
under pressure a chain loses its tail before its head, as an engine that evicts least-recently-
used KV blocks does. Each replica holds at most `per_replica_blocks` (its engine's cache size,
when known) and the whole index at most `max_bytes` (evicting from the replica holding most).
Nothing here reads a clock or a random source: the same trace gives the same index.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any

from plugins.contract.protocol import RequestSpec

# What one (replica, block) entry costs in memory, measured with tracemalloc (an OrderedDict
# entry and its linked node, the tables' slack and the 64-bit int key itself: ~225 bytes), rounded up.
ENTRY_BYTES = 256
CHARS_PER_TOKEN = 4  # to turn an engine's cache size in tokens into blocks of characters


def prompt_blocks(spec: RequestSpec, block_chars: int) -> list[int]:
    """The chained hashes of the prompt's full blocks, first to last."""
    if spec.messages is not None:
        data = _render(spec).encode("utf-8", "surrogatepass")
        step = block_chars
    elif isinstance(spec.prompt, list):
        data = b"".join(int(t).to_bytes(4, "little", signed=False) for t in spec.prompt)
        step = max(1, block_chars // CHARS_PER_TOKEN) * 4
    else:
        data = (spec.prompt or "").encode("utf-8", "surrogatepass")
        step = block_chars
    hasher = hashlib.blake2b(digest_size=8)
    blocks = []
    for end in range(step, len(data) + 1, step):
        hasher.update(data[end - step:end])
        blocks.append(int.from_bytes(hasher.copy().digest(), "little"))
    return blocks


def _render(spec: RequestSpec) -> str:
    """A canonical text of what the chat template will see, prefix-stable: the same
    conversation prefix always renders to the same text prefix (tools come first, as templates
    put them into the system turn)."""
    parts = []
    if spec.tools:
        parts.append(json.dumps(spec.tools, sort_keys=True, separators=(",", ":")))
    for message in spec.messages or ():
        parts.append(f"\x1e{message.get('role', '')}\x1f{_content(message.get('content'))}")
        if message.get("tool_calls"):
            parts.append(json.dumps(message["tool_calls"], sort_keys=True, separators=(",", ":")))
    return "".join(parts)


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


class PrefixIndex:
    def __init__(self, *, max_bytes: int, per_replica_blocks: int | None = None) -> None:
        self.max_entries = max(1, max_bytes // ENTRY_BYTES)
        self.per_replica_blocks = per_replica_blocks
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._entries = 0

    @property
    def num_entries(self) -> int:
        return self._entries

    @property
    def approx_bytes(self) -> int:
        return self._entries * ENTRY_BYTES

    def num_blocks(self, replica: str) -> int:
        lru = self._lru.get(replica)
        return 0 if lru is None else len(lru)

    def match(self, replica: str, blocks: list[int]) -> int:
        """How many leading blocks of `blocks` `replica` holds."""
        lru = self._lru.get(replica)
        if not lru:
            return 0
        n = 0
        for block in blocks:
            if block not in lru:
                break
            n += 1
        return n

    def insert(self, replica: str, blocks: list[int], *, capacity_blocks: int | None = None) -> None:
        """`replica` was sent a prompt of these blocks: it holds them now (most recent first)."""
        lru = self._lru.get(replica)
        if lru is None:
            lru = self._lru[replica] = OrderedDict()
        for block in reversed(blocks):
            if block in lru:
                lru.move_to_end(block)
            else:
                lru[block] = None
                self._entries += 1
        cap = capacity_blocks or self.per_replica_blocks
        if cap is not None:
            while len(lru) > cap:
                lru.popitem(last=False)
                self._entries -= 1
        while self._entries > self.max_entries:
            biggest = max(self._lru.values(), key=len)
            biggest.popitem(last=False)
            self._entries -= 1

    def remove(self, replica: str, blocks: list[int]) -> None:
        lru = self._lru.get(replica)
        if lru is None:
            return
        for block in blocks:
            if lru.pop(block, 0) is None:
                self._entries -= 1

    def drop(self, replica: str) -> None:
        lru = self._lru.pop(replica, None)
        if lru is not None:
            self._entries -= len(lru)
