"""KV cache groups in the bookkeeping (dry mode: no model): a hybrid's full and sliding tables,
the blocks a window drops, prefix hits that must hold for every group, and the all-or-nothing
count of an append whose window gives blocks back on the way."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from engine import EngineConfig, InvariantError, LLMEngine, OutOfBlocks
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.kv_groups import KVCacheGroup, dead_blocks, groups_of, max_blocks_held
from engine.core.sequence import Sequence
from engine.describe.narration import narrate
from tests.helpers import fingerprint

HYBRID = (KVCacheGroup("full", (), None), KVCacheGroup("sliding", (), 8))


def hybrid(blocks: int = 40, window: int = 8, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=blocks,
                                  sliding_window=window, **kw))


def test_groups_follow_the_layers_windows_full_first():
    groups = groups_of([128, None, 128, None])
    assert [(g.name, g.layers, g.window) for g in groups] == [("full", (1, 3), None),
                                                              ("sliding", (0, 2), 128)]
    assert [g.name for g in groups_of([4096] * 3)] == ["sliding"]
    assert [g.name for g in groups_of([None, 512, 1024])] == ["full", "sliding-512", "sliding-1024"]


def test_a_window_drops_exactly_the_blocks_no_later_query_sees():
    eng = hybrid()
    a = eng.add_sequence([7] * 27)  # 7 blocks; the next query (position 27) sees 20..27
    tables = eng.snapshot().sequences[a].block_tables
    assert len(tables["full"]) == len(tables["sliding"]) == 7
    assert None not in tables["full"]
    assert tables["sliding"][:5] == (None,) * 5 and None not in tables["sliding"][5:]
    assert dead_blocks(27, 8, 4, 7) == 5
    for _ in range(30):
        eng.append(a, n=1)
        held = [b for b in eng.snapshot().sequences[a].block_tables["sliding"] if b is not None]
        assert len(held) <= max_blocks_held(8, 4)
    drops = [e for e in eng.last_events if e.kind == "drop"]
    assert "left the window" in narrate(drops[-1]) if drops else True
    assert eng.snapshot().metrics.dropped_blocks > 0
    eng.check_invariants()


def test_a_dropped_block_shared_by_a_fork_stays_with_the_fork():
    eng = hybrid()
    a = eng.add_sequence([1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = eng.fork(a)
    shared = eng.snapshot().sequences[a].block_tables["sliding"][1]
    eng.append(a, n=8)  # a's window passes block 1; b still sees it
    assert eng.snapshot().sequences[a].block_tables["sliding"][1] is None
    assert eng.snapshot().sequences[b].block_tables["sliding"][1] == shared
    assert eng.snapshot().blocks[shared].ref_count == 1
    drop = next(e for e in eng.last_events if e.kind == "drop" and shared in e.block_ids)
    assert "still used by others" in narrate(drop)
    eng.check_invariants()


def test_a_copy_on_write_copies_the_shared_tail_in_every_group():
    eng = hybrid()
    a = eng.add_sequence([1, 2, 3, 4, 5, 6])  # the second block is partly filled
    b = eng.fork(a)
    eng.append(b, n=1)
    cows = [e for e in eng.last_events if e.kind == "cow"]
    assert len(cows) == 2 and eng.snapshot().metrics.cow_copies == 2
    written = next(e for e in eng.last_events if e.kind == "append")
    assert len(written.block_ids) == 2 and "of blocks" in narrate(written)
    eng.check_invariants()


def test_a_prefix_hit_needs_the_window_blocks_of_the_sliding_group():
    kv = KVCacheManager(24, 4, groups=HYBRID)
    first = Sequence(0)
    prompt = list(range(25))  # 6 full blocks could be hit (the last token is always computed)
    kv.allocate(first, prompt)
    kv.free(first)
    hits = [(kv.pool.lookup(h, prompt[j * 4:(j + 1) * 4], 1), h) for j, h in
            enumerate(first.block_hashes)]
    # the sliding group's copy of logical block 4 is evicted; the full group keeps all six
    lost = hits[4][0]
    kv.pool.cached_ids.pop(lost)  # evicted: out of the LRU, its hash forgotten, free
    del kv.pool.hash_to_block[(1, kv.pool.blocks[lost].block_hash)]
    kv.pool.blocks[lost].block_hash = None
    kv.pool.free_ids.append(lost)
    again = Sequence(1)
    kv.allocate(again, prompt)
    # a hit of 6 blocks needs sliding blocks 4-5 (positions 17..24 for the query at 24), of 5
    # blocks 3-4: both need the lost one; a hit of 4 blocks needs sliding blocks 2-3 only
    assert again.num_cached_tokens == 16
    assert again.block_tables[1][:2] == [None, None]
    assert again.block_tables[1][2:4] == [hits[2][0], hits[3][0]]
    kv.drop_out_of_window(again)  # what the engine does after every operation
    kv.check_invariants([again])


@settings(max_examples=60, deadline=None)
@given(prompt=st.integers(1, 30), first=st.integers(0, 12), n=st.integers(1, 40),
       blocks=st.integers(6, 30), window=st.integers(1, 13), fork=st.booleans())
def test_append_n_succeeds_exactly_when_n_one_token_appends_do(prompt, first, n, blocks, window,
                                                               fork):
    """The all-or-nothing check of append(n) counts the blocks each step's drops give back:
    it refuses exactly when some one-token append on the way would run out."""
    eng = hybrid(blocks, window)
    try:
        a = eng.add_sequence([5] * prompt)
        eng.append(a, n=first) if first else None
        if fork:
            eng.fork(a)
    except (OutOfBlocks, ValueError):  # a prompt or first append the pool cannot hold
        return
    one_by_one = LLMEngine.replay(eng.config, eng.trace)
    try:
        for _ in range(n):
            one_by_one.append(a, n=1)
        fits = True
    except OutOfBlocks:
        fits = False
    before = fingerprint(eng)
    try:
        eng.append(a, n=n)
        assert fits
        assert eng.snapshot().blocks == one_by_one.snapshot().blocks
        assert eng.snapshot().sequences == one_by_one.snapshot().sequences
    except OutOfBlocks:
        assert not fits
        assert fingerprint(eng) == before
    eng.check_invariants()


def test_the_invariants_catch_a_block_the_window_should_have_dropped():
    eng = hybrid()
    a = eng.add_sequence([3] * 27)
    free = eng.kv.pool.free_ids.popleft()  # a block no table holds, put where the window passed
    eng.kv.pool.blocks[free].ref_count = 1
    eng.kv.pool.blocks[free].owners = {a: None}
    eng.kv.pool.blocks[free].group = 1
    eng.seqs[a].block_tables[1][0] = free
    with pytest.raises(InvariantError, match="window"):
        eng.check_invariants()


def test_a_dry_window_needs_the_dry_mode_and_the_tier_one_group():
    with pytest.raises(ValueError, match="own config"):
        EngineConfig(model="tiny-random", sliding_window=8)
    with pytest.raises(ValueError, match="one KV cache group"):
        LLMEngine(EngineConfig(model=None, num_gpu_blocks=8, sliding_window=8, num_offload_blocks=4))
