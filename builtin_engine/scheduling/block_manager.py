"""Paged KV cache bookkeeping: fixed-size blocks, a block table per sequence, a free list, and
prefix caching.

Prefix caching: once a block is full and its KV computed, it is registered under a hash chain of
its tokens (hash of the parent block's hash and the block's token ids), so a later sequence whose
prompt starts with the same tokens reuses it. Blocks are reference-counted; a block whose count
drops to zero goes to the end of the free list but stays findable by its hash until it is handed
out again, so the free list doubles as the LRU eviction order (oldest first). A sequence's blocks
are freed tail first, so a shared prefix outlives the tails that hang off it.

The manager never touches tensors: it hands out block ids that index the model runner's caches.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence as SequenceOf

from builtin_engine.scheduling.sequence import Sequence


def hash_block(parent: bytes | None, token_ids: SequenceOf[int]) -> bytes:
    """The identity of a full block: its tokens and (through `parent`) every token before them."""
    digest = hashlib.blake2b(parent or b"", digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


class Block:
    __slots__ = ("block_id", "ref_count", "block_hash")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: bytes | None = None  # set while registered in the prefix cache


class BlockManager:
    def __init__(self, *, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # ref_count == 0 blocks in eviction order (front = least recently used)
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[bytes, int] = {}  # block hash -> block id

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody holds, including cached ones that may be evicted."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids holding the longest cached run of `seq`'s leading full blocks. Never covers
        the last token, which must be computed to produce logits. Takes no references."""
        if not self.enable_prefix_caching:
            return []
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits: list[int] = []
        for i in range(max_blocks):
            block_id = self._cached.get(self._block_hash(seq, i))
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def allocate_slots(self, seq: Sequence, num_tokens: int, cached_blocks: SequenceOf[int] = ()) -> bool:
        """Grow `seq`'s block table to hold `num_tokens` tokens, first adopting `cached_blocks`
        (from `find_cached_prefix`, only on an empty table). All or nothing: returns False, with
        nothing changed, when too few blocks are free."""
        num_new = self.num_blocks_for(num_tokens) - len(seq.block_table) - len(cached_blocks)
        num_revived = sum(1 for b in cached_blocks if self.blocks[b].ref_count == 0)
        if num_new + num_revived > len(self._free):
            return False
        for block_id in cached_blocks:
            self._take(block_id)
            seq.block_table.append(block_id)
            seq.num_registered_blocks += 1
        for _ in range(max(num_new, 0)):
            seq.block_table.append(self._pop_free())
        return True

    def register_full_blocks(self, seq: Sequence) -> None:
        """Put `seq`'s newly full, computed blocks into the prefix cache. Called after each step."""
        if not self.enable_prefix_caching:
            return
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        for i in range(seq.num_registered_blocks, num_full):
            block = self.blocks[seq.block_table[i]]
            block_hash = self._block_hash(seq, i)
            if block.block_hash is None and block_hash not in self._cached:
                block.block_hash = block_hash
                self._cached[block_hash] = block.block_id
        seq.num_registered_blocks = max(seq.num_registered_blocks, num_full)

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s references, tail first, so shared prefixes are evicted last."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
        seq.block_table = []
        seq.num_registered_blocks = 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached block that nobody holds (tests and benchmarks)."""
        for block_hash, block_id in list(self._cached.items()):
            if self.blocks[block_id].ref_count == 0:
                self.blocks[block_id].block_hash = None
                del self._cached[block_hash]

    def _block_hash(self, seq: Sequence, index: int) -> bytes:
        hashes = seq.block_hashes
        bs = self.block_size
        while len(hashes) <= index:
            i = len(hashes)
            hashes.append(hash_block(hashes[i - 1] if i else None, seq.token_ids[i * bs : (i + 1) * bs]))
        return hashes[index]

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1

    def _pop_free(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:  # evict it from the prefix cache
            if self._cached.get(block.block_hash) == block_id:
                del self._cached[block.block_hash]
            block.block_hash = None
        block.ref_count = 1
        return block_id
