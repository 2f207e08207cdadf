"""Scheduler policy: budgets, chunked prefill, priority order, preemption (no model needed)."""

from __future__ import annotations

import itertools

from builtin_engine.scheduling.block_manager import BlockManager
from builtin_engine.scheduling.sampling_params import SamplingParams
from builtin_engine.scheduling.scheduler import Scheduler, SchedulerOutput
from builtin_engine.scheduling.sequence import Sequence, SequenceStatus

_ids = itertools.count()


def make_seq(n_prompt: int, *, priority: int = 0, arrival: int | None = None, first: int = 0,
             waits_for: Sequence | None = None, index: int = 0) -> Sequence:
    seq_id = next(_ids)
    return Sequence(seq_id=seq_id, request_id=f"r{seq_id}", index=index,
                    prompt_ids=list(range(first, first + n_prompt)), params=SamplingParams(),
                    priority=priority, arrival=seq_id if arrival is None else arrival, seed=0, max_tokens=100,
                    waits_for=waits_for)


def run_step(sched: Scheduler, token: int = 7) -> SchedulerOutput:
    """Schedule, pretend the model ran, append a token to every sampling sequence."""
    out = sched.schedule()
    sched.update_after_step(out)
    for chunk in out.chunks:
        if chunk.end == chunk.seq.num_tokens:
            chunk.seq.append_token(token)
    return out


def make_sched(*, num_blocks: int = 64, block_size: int = 4, max_num_seqs: int = 8, budget: int = 16) -> Scheduler:
    return Scheduler(block_manager=BlockManager(num_blocks=num_blocks, block_size=block_size),
                     max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)


def test_chunked_prefill_then_decode_first() -> None:
    sched = make_sched(budget=8)
    a = make_seq(20)
    sched.add(a)
    assert [(c.start, c.num_tokens) for c in run_step(sched).chunks] == [(0, 8)]
    assert [(c.start, c.num_tokens) for c in run_step(sched).chunks] == [(8, 8)]
    b = make_seq(30, first=1000)
    sched.add(b)
    out = run_step(sched)  # a's last 4 prompt tokens, then 4 of b's
    assert [(c.seq, c.start, c.num_tokens) for c in out.chunks] == [(a, 16, 4), (b, 0, 4)]
    out = run_step(sched)  # a decodes (first row), b takes the rest of the budget
    assert [(c.seq, c.num_tokens) for c in out.chunks] == [(a, 1), (b, 7)]
    assert out.chunks[0].is_decode and not out.chunks[1].is_decode


def test_max_num_seqs_and_priority_order() -> None:
    sched = make_sched(max_num_seqs=2, budget=64)
    low = [make_seq(4, priority=5, first=100 * i) for i in range(3)]
    for s in low:
        sched.add(s)
    run_step(sched)
    assert {s.status for s in low[:2]} == {SequenceStatus.RUNNING}
    urgent = make_seq(4, priority=-1, first=900)
    sched.add(urgent)
    sched.finish(low[0])
    run_step(sched)
    # the freed slot goes to the urgent request, not to the earlier low-priority one
    assert urgent.status is SequenceStatus.RUNNING and low[2].status is SequenceStatus.WAITING


def test_arrival_order_within_priority() -> None:
    sched = make_sched(max_num_seqs=1, budget=64)
    seqs = [make_seq(4, priority=1, arrival=10 - i, first=100 * i) for i in range(3)]
    for s in seqs:
        sched.add(s)
    order = []
    for _ in range(3):
        run_step(sched)
        running = sched.running[0]
        order.append(running)
        sched.finish(running)
    assert order == [seqs[2], seqs[1], seqs[0]]


def test_preemption_picks_lowest_priority_latest_arrival() -> None:
    sched = make_sched(num_blocks=6, block_size=4, budget=64)
    a = make_seq(8, priority=0, first=0)
    b = make_seq(7, priority=0, first=100)
    c = make_seq(3, priority=1, first=200)
    for s in (a, b, c):
        sched.add(s)
    run_step(sched)  # a: 2 blocks, b: 2 blocks, c: 1 block -> 1 free
    assert len(sched.block_manager._free) == 1
    # a needs a third block next step, then b. One is free; then c (lowest priority) is preempted.
    for _ in range(5):
        out = run_step(sched)
        if out.preempted:
            break
    assert out.preempted == [c]
    assert c.status is SequenceStatus.WAITING and c.block_table == [] and c.num_computed_tokens == 0
    assert c.num_output_tokens >= 1 and c.token_ids[3:] == [7] * c.num_output_tokens  # output survives
    assert sched.num_preemptions == 1


def test_preempted_sequence_recomputes_prompt_and_output() -> None:
    sched = make_sched(num_blocks=4, block_size=4, budget=64)
    a = make_seq(7, first=0)
    b = make_seq(7, first=100)
    sched.add(a)
    sched.add(b)
    run_step(sched)  # 2 + 2 blocks, full
    run_step(sched)  # the 8th tokens still fit; the 9th need a fifth block
    out = run_step(sched)
    assert out.preempted == [b]  # b is the later arrival; a got its block
    sched.finish(a)
    num_tokens_before = b.num_tokens
    out = run_step(sched)
    # b comes back and recomputes what it had (prompt + output so far). Its blocks went to the
    # free list tail first; a took the tail block, so the first block is still cached.
    (chunk,) = [c for c in out.chunks if c.seq is b]
    assert (chunk.start, chunk.end) == (4, num_tokens_before) and num_tokens_before == 9


def test_follower_waits_for_leader_prefill() -> None:
    sched = make_sched(budget=8)
    leader = make_seq(12)
    follower = make_seq(12, waits_for=leader, arrival=leader.arrival, index=1)
    sched.add(leader)
    sched.add(follower)
    out = run_step(sched)
    assert [c.seq for c in out.chunks] == [leader]  # follower may not start yet
    run_step(sched)  # leader's prefill completes
    out = run_step(sched)
    follow = [c for c in out.chunks if c.seq is follower]
    # the follower found the leader's two full blocks (8 tokens) in the prefix cache
    assert follow and follow[0].start == 8 and follower.num_cached_tokens == 8
    assert follower.block_table[:2] == leader.block_table[:2]
