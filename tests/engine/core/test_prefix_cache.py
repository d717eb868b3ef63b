"""Prefix caching: chained hashes, the collision guard, the hit cap, LRU eviction."""

from engine import EngineConfig, LLMEngine
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.sequence import Sequence

BS = 4


def dry(num_blocks: int = 16, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=None, block_size=BS, num_gpu_blocks=num_blocks, **kw))


def kinds(events) -> list[str]:
    return [e.kind for e in events]


def test_second_request_with_the_same_prefix_hits_and_shares_blocks():
    eng = dry()
    system = list(range(1, 9))  # two full blocks
    a = eng.add_sequence(system + [50, 51])
    b = eng.add_sequence(system + [60])
    snap = eng.snapshot()
    ta, tb = snap.sequences[a].block_table, snap.sequences[b].block_table
    assert ta[:2] == tb[:2] and ta[2] != tb[2]
    assert snap.sequences[b].num_cached_tokens == 8
    assert [snap.blocks[x].ref_count for x in ta[:2]] == [2, 2]
    assert "prefix_hit" in kinds(eng.last_events) and "share" in kinds(eng.last_events)
    assert snap.metrics.prefix_hit_blocks == 2


def test_prefix_caching_off_never_shares():
    eng = dry(enable_prefix_caching=False)
    a = eng.add_sequence(list(range(1, 10)))
    b = eng.add_sequence(list(range(1, 10)))
    snap = eng.snapshot()
    assert not set(snap.sequences[a].block_table) & set(snap.sequences[b].block_table)
    assert snap.metrics.prefix_hit_blocks == 0
    assert all(blk.block_hash is None for blk in snap.blocks)


def test_hash_chain_same_tokens_after_a_different_prefix_do_not_hit():
    eng = dry()
    eng.add_sequence([1, 2, 3, 4, 9, 9, 9, 9, 0])
    b = eng.add_sequence([5, 6, 7, 8, 9, 9, 9, 9, 0])  # block 2 has equal tokens, other parent
    assert eng.snapshot().sequences[b].num_cached_tokens == 0


def test_collision_guard_equal_hashes_with_different_tokens_do_not_share():
    mgr = KVCacheManager(16, BS, hash_fn=lambda parent, tokens: 42)  # every block hashes to 42
    a, b = Sequence(0), Sequence(1)
    mgr.allocate(a, [1, 2, 3, 4, 5])
    events = mgr.allocate(b, [7, 7, 7, 7, 5])
    assert "prefix_hit" not in kinds(events)
    assert not set(a.block_table) & set(b.block_table)
    assert mgr.pool.blocks[b.block_table[0]].token_ids == [7, 7, 7, 7]
    # equal tokens still hit through the same (colliding) hash
    c = Sequence(2)
    mgr.allocate(c, [1, 2, 3, 4, 6])
    assert c.block_table[0] == a.block_table[0]
    mgr.check_invariants([a, b, c])


def test_fully_cached_prompt_recomputes_its_last_block():
    eng = dry()
    prompt = list(range(1, 9))  # exactly two full blocks
    a = eng.add_sequence(prompt)
    b = eng.add_sequence(prompt)
    snap = eng.snapshot()
    assert snap.sequences[b].num_cached_tokens == 4  # capped: the last block is computed
    ta, tb = snap.sequences[a].block_table, snap.sequences[b].block_table
    assert ta[0] == tb[0] and ta[1] != tb[1]
    # no deduplication after the fact: two live blocks hold the same content
    assert snap.blocks[ta[1]].token_ids == snap.blocks[tb[1]].token_ids


def test_cached_blocks_serve_hits_after_their_owner_is_freed():
    eng = dry()
    a = eng.add_sequence(list(range(1, 10)))
    blocks_a = eng.snapshot().sequences[a].block_table
    eng.free(a)
    snap = eng.snapshot()
    assert [snap.blocks[x].state for x in blocks_a] == ["cached", "cached", "free"]
    b = eng.add_sequence(list(range(1, 9)) + [77])
    snap = eng.snapshot()
    assert snap.sequences[b].block_table[:2] == blocks_a[:2]
    assert [snap.blocks[x].state for x in blocks_a[:2]] == ["used", "used"]
    assert snap.blocks[blocks_a[0]].ref_count == 1


def test_never_hashed_blocks_are_reused_before_cached_ones():
    eng = dry(num_blocks=6)
    a = eng.add_sequence(list(range(1, 9)))  # blocks 0, 1 (both full: cached after free)
    eng.free(a)
    b = eng.add_sequence([90, 91, 92, 93, 94, 95, 96, 97, 98])  # needs 3 of the 4 free blocks
    snap = eng.snapshot()
    assert set(snap.sequences[b].block_table) == {2, 3, 4}
    assert [snap.blocks[i].state for i in (0, 1)] == ["cached", "cached"]
    assert "evict" not in kinds(eng.last_events)


def test_lru_eviction_takes_the_last_block_of_a_freed_sequence_first():
    eng = dry(num_blocks=3)
    a = eng.add_sequence(list(range(1, 9)) + [50])  # blocks 0, 1 full; 2 partial
    eng.free(a)
    assert eng.snapshot().cached_lru == (1, 0)  # last block first in line for eviction
    b = eng.add_sequence([70, 71, 72, 73, 74])  # 2 blocks: free block 2, then evicts block 1
    events = eng.last_events
    evicted = [e.block_ids[0] for e in events if e.kind == "evict"]
    assert evicted == [1]
    snap = eng.snapshot()
    assert set(snap.sequences[b].block_table) == {1, 2}
    assert snap.blocks[0].state == "cached" and snap.metrics.evictions == 1
    # the prefix head survived: a prompt starting with it still hits block 0
    eng.free(b)
    c = eng.add_sequence([1, 2, 3, 4, 60])
    assert eng.snapshot().sequences[c].block_table[0] == 0
    eng.check_invariants()


def test_evicted_hash_no_longer_hits():
    eng = dry(num_blocks=2)
    a = eng.add_sequence([1, 2, 3, 4, 5])
    eng.free(a)
    b = eng.add_sequence([9, 9, 9, 9, 9, 9, 9, 9])  # takes both blocks: evicts the cached one
    eng.free(b)
    c = eng.add_sequence([1, 2, 3, 4, 5])
    assert eng.snapshot().sequences[c].num_cached_tokens == 0
    eng.check_invariants()
