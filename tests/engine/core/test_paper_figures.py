"""The paper's figures (PagedAttention, SOSP 2023) replayed on the dry engine, block by block."""

from engine import EngineConfig, LLMEngine


def dry(block_size: int = 4, num_blocks: int = 8, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=None, block_size=block_size, num_gpu_blocks=num_blocks, **kw))


def table(eng: LLMEngine, seq: int) -> tuple[int, ...]:
    return eng.snapshot().sequences[seq].block_table


def fills(eng: LLMEngine, seq: int) -> list[int]:
    snap = eng.snapshot()
    return [snap.blocks[b].num_filled for b in snap.sequences[seq].block_table]


def test_fig6_prompt_fills_4_plus_3_then_decode_crosses_block_boundary():
    eng = dry()
    s = eng.add_sequence([11, 12, 13, 14, 15, 16, 17])
    assert fills(eng, s) == [4, 3]
    eng.append(s, token_ids=[18])  # the 8th token fills the second block
    assert fills(eng, s) == [4, 4]
    assert len(table(eng, s)) == 2
    events = eng.append(s, token_ids=[19])  # the 9th needs a third block
    assert fills(eng, s) == [4, 4, 1]
    assert [e.kind for e in events] == ["allocate", "append"]
    eng.check_invariants()


def test_fig7_two_sequences_interleave_in_one_pool():
    eng = dry(num_blocks=8, enable_prefix_caching=False)
    a = eng.add_sequence(list(range(1, 8)))  # 7 tokens: 2 blocks
    b = eng.add_sequence(list(range(20, 25)))  # 5 tokens: 2 blocks
    eng.append(a, token_ids=[8, 9])  # a needs a third block, allocated after b's
    eng.append(b, token_ids=[25, 26, 27, 28])  # b needs a third block too
    ta, tb = table(eng, a), table(eng, b)
    assert ta == (0, 1, 4) and tb == (2, 3, 5)  # logical order != physical order
    assert not set(ta) & set(tb)
    snap = eng.snapshot()
    assert snap.metrics.used_blocks == 6 and snap.num_free_blocks == 2
    eng.check_invariants()


def test_fig8_parallel_sampling_shares_until_the_first_write_copies():
    eng = dry()
    a = eng.add_sequence([1, 2, 3, 4, 5, 6, 7])
    b = eng.fork(a)
    snap = eng.snapshot()
    assert table(eng, a) == table(eng, b) == (0, 1)
    assert [snap.blocks[i].ref_count for i in (0, 1)] == [2, 2]
    assert snap.metrics.used_blocks == 2  # fork copied nothing

    ev = eng.append(a, token_ids=[8])  # a writes into the shared, partly filled block 1
    cow = [e for e in ev if e.kind == "cow"]
    assert len(cow) == 1 and cow[0].block_ids == (1, 2)
    snap = eng.snapshot()
    assert table(eng, a) == (0, 2) and table(eng, b) == (0, 1)
    assert snap.blocks[2].token_ids == (5, 6, 7, 8)  # the copy, then the write
    assert snap.blocks[1].token_ids == (5, 6, 7) and snap.blocks[1].ref_count == 1

    ev = eng.append(b, token_ids=[9])  # the last holder writes in place
    assert "cow" not in [e.kind for e in ev] and "allocate" not in [e.kind for e in ev]
    assert eng.snapshot().blocks[1].token_ids == (5, 6, 7, 9)
    assert eng.snapshot().blocks[0].ref_count == 2  # the full prompt block stays shared
    assert eng.snapshot().metrics.cow_copies == 1
    eng.check_invariants()


def test_fig9_beam_tree_freeing_pruned_candidates_returns_exactly_unshared_blocks():
    eng = dry(num_blocks=16, enable_prefix_caching=False)
    root = eng.add_sequence([1, 2, 3, 4, 5, 6])  # blocks 0 (full) and 1 (2 of 4)
    b0, b1, b2, b3 = (eng.fork(root) for _ in range(4))
    eng.free(root)
    for i, s in enumerate((b0, b1, b2, b3)):  # every beam diverges: each copies block 1
        eng.append(s, token_ids=[100 + i, 110 + i, 120 + i])
    # beams 0 and 1 survive and extend; beam 2 and 3 are pruned
    eng.append(b0, token_ids=[7])
    snap = eng.snapshot()
    pruned = [snap.sequences[s].block_table for s in (b2, b3)]
    expect = {b for t in pruned for b in t if snap.blocks[b].ref_count == 1}
    released = set()
    for s in (b2, b3):
        (ev,) = [e for e in eng.free(s) if e.kind == "free"]
        released |= set(ev.block_ids)
    assert released == expect
    snap = eng.snapshot()
    assert snap.blocks[0].ref_count == 2  # the shared prompt block survives with the live beams
    assert all(snap.blocks[b].state == "free" for b in released)
    eng.check_invariants()
