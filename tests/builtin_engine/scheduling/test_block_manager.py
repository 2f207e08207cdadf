"""Block manager: allocation, reference counts, the prefix cache's hash chain and LRU eviction."""

from __future__ import annotations

from builtin_engine.scheduling.block_manager import BlockManager, hash_block
from builtin_engine.scheduling.sampling_params import SamplingParams
from builtin_engine.scheduling.sequence import Sequence

_ids = iter(range(10**9))


def make_seq(tokens: list[int]) -> Sequence:
    return Sequence(seq_id=next(_ids), request_id="r", index=0, prompt_ids=tokens, params=SamplingParams(),
                    priority=0, arrival=0, seed=0, max_tokens=16)


def compute_all(bm: BlockManager, seq: Sequence) -> None:
    assert bm.allocate_slots(seq, seq.num_tokens, bm.find_cached_prefix(seq))
    seq.num_computed_tokens = seq.num_tokens
    bm.register_full_blocks(seq)


def test_allocate_is_all_or_nothing() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    a = make_seq(list(range(10)))
    assert bm.allocate_slots(a, 10)
    assert len(a.block_table) == 3 and bm.num_free_blocks == 1
    b = make_seq(list(range(100, 108)))
    assert not bm.allocate_slots(b, 8)
    assert b.block_table == [] and bm.num_free_blocks == 1
    bm.free(a)
    assert bm.num_free_blocks == 4


def test_hash_chain_depends_on_parent() -> None:
    h1 = hash_block(None, [1, 2])
    assert hash_block(h1, [3, 4]) != hash_block(hash_block(None, [9, 9]), [3, 4])
    assert hash_block(h1, [3, 4]) == hash_block(hash_block(None, [1, 2]), [3, 4])


def test_prefix_hit_shares_blocks_and_never_covers_last_token() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    a = make_seq(list(range(12)))
    compute_all(bm, a)
    b = make_seq(list(range(12)))  # identical prompt: last block must be recomputed
    hits = bm.find_cached_prefix(b)
    assert hits == a.block_table[:2]
    c = make_seq(list(range(9)) + [99, 98, 97, 96])  # shares two full blocks only
    assert bm.find_cached_prefix(c) == a.block_table[:2]
    d = make_seq([7] + list(range(1, 12)))  # differs in the first block: no hit at all
    assert bm.find_cached_prefix(d) == []
    assert bm.allocate_slots(b, 12, hits)
    assert b.block_table[:2] == a.block_table[:2]
    assert bm.blocks[a.block_table[0]].ref_count == 2


def test_freed_blocks_stay_cached_until_evicted_lru() -> None:
    bm = BlockManager(num_blocks=6, block_size=2)
    a = make_seq([1, 2, 3, 4, 5])
    compute_all(bm, a)  # 3 blocks, 2 full and registered
    bm.free(a)
    assert bm.num_free_blocks == 6 and bm.num_cached_blocks == 2
    again = make_seq([1, 2, 3, 4, 9])
    assert len(bm.find_cached_prefix(again)) == 2
    # Take 5 blocks: the 3 never used go first, then a's tail (freed first), then a's second
    # full block; the first (the shared prefix's root) survives longest.
    other = make_seq(list(range(100, 110)))
    assert bm.allocate_slots(other, 10)
    assert bm.num_cached_blocks == 1  # a's second full block was evicted, the first survives
    assert len(bm.find_cached_prefix(again)) == 1


def test_reviving_a_cached_free_block_counts_against_free_space() -> None:
    bm = BlockManager(num_blocks=3, block_size=2)
    a = make_seq([1, 2, 3, 4, 5])
    compute_all(bm, a)
    bm.free(a)
    b = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9])  # needs 5 blocks, 2 of them cached: too many
    hits = bm.find_cached_prefix(b)
    assert len(hits) == 2
    assert not bm.allocate_slots(b, 9, hits)
    assert bm.num_free_blocks == 3 and all(blk.ref_count == 0 for blk in bm.blocks)
