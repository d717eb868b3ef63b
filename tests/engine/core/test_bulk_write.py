"""A prompt's tokens written as one operation (`BlockWriter.write` without narration: a prompt,
a chunk, a tier load) against the same tokens written one at a time: the same blocks in every
table, the same tokens read back from them, the same hashes, evictions, copies to the device and
offloads to the CPU tier, whatever the pool held before (cached blocks to evict, a shared last
block to copy on write, a hybrid's sliding group). Where they part: one operation hashes its
blocks after it has taken them all, so a hash whose cached block it evicted stays findable."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from engine.core.block_pool import OutOfBlocks
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.kv_groups import KVCacheGroup, single_group
from engine.core.sequence import Sequence

BS = 4
HYBRID = (KVCacheGroup("full", (), None), KVCacheGroup("sliding", (), 8))
tokens = st.lists(st.integers(0, 3), min_size=1, max_size=40)  # few ids: hashes repeat


def _manager(blocks: int, slots: int, hybrid: bool, history: list[list[int]]) -> KVCacheManager:
    """A manager whose pool and tier hold what `history`'s prompts left behind (cached blocks,
    evicted ones offloaded), built the same way each time."""
    mgr = KVCacheManager(blocks, BS, num_offload_blocks=slots,
                         groups=HYBRID if hybrid else single_group())
    for i, prompt in enumerate(history):
        seq = Sequence(100 + i)
        try:
            mgr.allocate(seq, prompt)
        except OutOfBlocks:
            continue
        mgr.drop_out_of_window(seq)
        mgr.free(seq)
    mgr.take_copies()
    return mgr


def _write(mgr: KVCacheManager, prompt: list[int], more: list[int], fork: bool, bulk: bool):
    seq, child = Sequence(1), Sequence(2)
    mgr.allocate(seq, prompt)
    mgr.drop_out_of_window(seq)
    if fork:  # the last block shared: the write copies it first
        mgr.fork(seq, child)
    mgr.take_copies()
    events: list = []
    try:
        mgr.check_append(seq, len(more))
    except OutOfBlocks:
        return None
    mgr.writer.write(seq, more, events, narrate_each=not bulk)
    events += mgr.drop_out_of_window(seq)  # as the engine does after every operation
    return seq, events, [seq, child] if fork else [seq]


@settings(max_examples=300, deadline=None)
@given(history=st.lists(tokens, max_size=6), prompt=tokens, more=tokens, fork=st.booleans(),
       blocks=st.integers(8, 40), slots=st.sampled_from([0, 6]), hybrid=st.booleans())
def test_one_operation_writes_what_token_by_token_writes(history, prompt, more, fork, blocks,
                                                         slots, hybrid) -> None:
    slots = 0 if hybrid else slots  # the tier serves models of one KV cache group
    done = {}
    for bulk in (True, False):
        mgr = _manager(blocks, slots, hybrid, history)
        try:
            got = _write(mgr, prompt, more, fork, bulk)
        except OutOfBlocks:
            return  # the prompt itself does not fit: nothing to compare
        if got is None:
            return
        seq, events, live = got
        mgr.check_invariants(live)
        read_back = [[mgr.pool.blocks[b].token_ids if b is not None else None for b in table]
                     for table in seq.block_tables]
        moved = [(e.kind, e.block_ids, e.facts) for e in events
                 if e.kind in ("evict", "offload", "cow", "drop")]
        done[bulk] = (seq.block_tables, read_back, seq.block_hashes, seq.token_ids, moved,
                      mgr.take_copies(), mgr.writer.evictions, mgr.tier.state()), \
            mgr.pool.hash_to_block.items()
    assert done[True][0] == done[False][0]
    # the one operation takes its blocks (evicting) before it hashes them: every hash the token
    # by token write left findable is findable, and maybe one more (the next test)
    assert done[True][1] >= done[False][1]
    tables, read_back, _, written, *_ = done[True][0]
    for table in read_back:  # and what the tables read back is the sequence's tokens
        assert [t for block in table if block is not None for t in block] == \
            written[len(written) - sum(len(b) for b in table if b is not None):]


def test_a_hash_whose_cached_block_the_write_evicts_stays_findable() -> None:
    """A pool of 4 blocks caches A B C; a prompt A then B C written after it: its blocks for
    B and C evict C's and B's cached blocks. Token by token, B's new block is hashed while the
    old one still holds its hash (so it is not registered), and then the old one is evicted:
    nobody serves B's hash any more. As one operation, as vLLM allocates a chunk's blocks
    before it caches them, the evictions come first and the new block serves it."""
    a, b, c = [1] * BS, [2] * BS, [3] * BS
    served = {}
    for bulk in (True, False):
        mgr = _manager(4, 0, False, [a + b + c + [9]])
        seq, _, _ = _write(mgr, a, b + c, False, bulk)
        hashes = dict(mgr.pool.hash_to_block)
        served[bulk] = [hashes.get((0, h)) for h in seq.block_hashes]
        assert seq.block_table == [3, 2, 1]
    assert served[True] == [0, 2, 1]  # A's hash: the cached block the prompt did not hit
    assert served[False] == [0, None, 1]


def _drop_one_by_one(mgr: KVCacheManager, seq: Sequence) -> list:
    """The sliding group's drop a block at a time (`decref` each, walking back from the last
    dead block), as the manager did before it dropped a run of them in one call."""
    from engine.core.events import Dropped
    from engine.core.kv_groups import dead_blocks

    group = HYBRID[1]
    table = seq.block_tables[1]
    j = dead_blocks(seq.num_tokens, group.window, BS, len(table)) - 1
    if j < 0 or table[j] is None:
        return []
    dropped, released = [], []
    while j >= 0 and table[j] is not None:
        b, table[j] = table[j], None
        dropped.append(b)
        if mgr.pool.decref(b, seq.seq_id):
            released.append(b)
        j -= 1
    cached = tuple(b for b in released if mgr.pool.blocks[b].block_hash is not None)
    return [(tuple(reversed(dropped)), Dropped(group.name, group.window, j + 1, cached,
                                               tuple(b for b in dropped if b not in released)))]


@settings(max_examples=200, deadline=None)
@given(history=st.lists(tokens, max_size=6), prompt=tokens, fork=st.booleans(),
       blocks=st.integers(8, 40))
def test_a_window_drops_a_run_of_blocks_as_one_at_a_time_would(history, prompt, fork, blocks):
    """A prompt's blocks past the sliding window given back in one call: the same tables, the
    same event, and the pool (ref counts, the LRU order of the cached ones, the free list)
    exactly as dropping them a block at a time leaves it."""
    done = []
    for reference in (False, True):
        mgr = _manager(blocks, 0, True, history)
        seq, child = Sequence(1), Sequence(2)
        try:
            mgr.allocate(seq, prompt)
        except OutOfBlocks:
            return
        if fork:  # the dropped blocks shared: only this table's reference goes
            mgr.fork(seq, child)
        live = [seq, child] if fork else [seq]
        got = [_drop_one_by_one(mgr, s) if reference else
               [(e.block_ids, e.facts) for e in mgr.drop_out_of_window(s)] for s in live]
        mgr.check_invariants(live)
        done.append((got, [s.block_tables for s in live], mgr.pool.state()))
    assert done[0] == done[1]


@settings(max_examples=200, deadline=None)
@given(prompts=st.lists(tokens, min_size=1, max_size=5), forks=st.lists(st.booleans(), max_size=5),
       picks=st.lists(st.integers(-1, 3), min_size=5, max_size=5), hybrid=st.booleans(),
       prefix=st.booleans())
def test_a_decode_steps_appends_at_once_write_what_one_by_one_writes(prompts, forks, picks,
                                                                   hybrid, prefix) -> None:
    """A decode step's appends (`append_decodes`: the common case inline, the tokens into the
    pool as one operation) against `write` of each token, narrated, in turn: the same tables,
    tokens read back, hashes, events and copies, whether a last block is shared (a fork), full,
    hashed or in a hybrid's two tables; -1 stands for a token still on the device."""
    done = {}
    for at_once in (True, False):
        mgr = KVCacheManager(64, BS, groups=HYBRID if hybrid else single_group(),
                             enable_prefix_caching=prefix)
        seqs = []
        for i, prompt in enumerate(prompts):
            seq = Sequence(2 * i)
            mgr.allocate(seq, prompt)
            mgr.drop_out_of_window(seq)  # as the engine does after every operation
            seqs.append(seq)
            if i < len(forks) and forks[i]:  # its last block shared with a child
                child = Sequence(2 * i + 1)
                mgr.fork(seq, child)
                seqs.append(child)
        mgr.take_copies()
        step = seqs[:5]
        events: list = []
        if at_once:
            mgr.append_decodes(step, picks[:len(step)], events)
        else:
            for seq, token in zip(step, picks, strict=False):
                mgr.writer.write(seq, [token], events, narrate_each=True)
        events += mgr.drop_out_of_window_all(seqs)
        mgr.check_invariants(seqs)
        read_back = [[[mgr.pool.blocks[b].token_ids if b is not None else None for b in table]
                      for table in s.block_tables] for s in seqs]
        done[at_once] = ([s.block_tables for s in seqs], read_back, [s.token_ids for s in seqs],
                         [s.block_hashes for s in seqs], events, mgr.take_copies(),
                         dict(mgr.pool.hash_to_block), mgr.pool.state())
    assert done[True] == done[False]
