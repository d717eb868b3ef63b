"""The prefix cache as a tree (engine/describe/prefix_tree.py) against the cached blocks and their
hash chain, after every operation of a run through prefix hits, forks, copy-on-write, evictions,
offloads into the CPU tier and loads back: every hashed block of the pool and every tier entry
is exactly one node, each edge is a link of the chain (checked with the hash function itself
and with the live sequences' tables), ref counts and LRU places are the snapshot's."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.core.hashing import hash_block
from engine.describe.prefix_tree import UNKNOWN_PARENT, HashChain

SYSTEM = "You are a tutor. "  # 17 bytes: four full blocks of 4 shared by every prompt


def _check(eng: LLMEngine, group: str | None = None) -> None:
    snap = eng.snapshot()
    tree = eng.prefix_tree(snap, group)
    group = tree.group
    nodes = {n.block_hash: n for n in tree.nodes}
    assert len(nodes) == len(tree.nodes), "a hash is one node"
    pool = {b.block_hash: b for b in snap.blocks if b.block_hash is not None and b.group == group}
    tier = {t.block_hash: t for t in snap.tier_blocks if t.block_hash is not None}
    assert set(nodes) == set(pool) | set(tier)
    lru = list(snap.cached_lru)
    for h, n in nodes.items():
        if h in pool:
            b = pool[h]
            assert (n.block_id, n.ref_count, n.token_ids) == (b.block_id, b.ref_count, b.token_ids)
            assert n.lru == (lru.index(b.block_id) if b.state == "cached" else None)
        else:
            assert n.block_id is None and n.token_ids == tier[h].token_ids
        assert n.tier_slot == (tier[h].block_id if h in tier else None)
        if h in tier:
            assert n.tier_lru == list(snap.tier_lru).index(n.tier_slot)
        # the edge is a link of the chain: the hash function says so
        if n.parent is None:
            assert hash_block(None, n.token_ids) == h and n.depth == 0 and not n.orphan
        elif n.parent != UNKNOWN_PARENT:
            assert hash_block(n.parent, n.token_ids) == h
            assert n.orphan == (n.parent not in nodes)
            if not n.orphan:
                assert n.depth == nodes[n.parent].depth + 1
        else:
            assert n.orphan and n.depth is None
    # and the live sequences' tables say the same: consecutive full blocks are parent and child
    for seq in snap.sequences.values():
        full = seq.num_tokens // snap.block_size
        hashes = [None if b is None else snap.blocks[b].block_hash
                  for b in seq.block_tables[group][:full]]
        for i, h in enumerate(hashes):
            if h is not None and (i == 0 or hashes[i - 1] is not None):
                assert (hashes[i - 1] if i else None, h) in tree.edges()
    # parents are drawn before children; a chain learnt from scratch (by trial) agrees
    order = [n.block_hash for n in tree.nodes]
    for n in tree.nodes:
        if n.parent in nodes:
            assert order.index(n.parent) < order.index(n.block_hash)
    fresh = HashChain().tree(snap, group)
    assert {(n.block_hash, n.parent) for n in fresh.nodes if not n.orphan} == \
        {(n.block_hash, n.parent) for n in tree.nodes if not n.orphan}


def test_the_tree_is_the_cache_through_hits_forks_evictions_offloads_and_loads():
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=20, num_offload_blocks=6))
    kinds = set()

    def did(events):
        kinds.update(e.kind for e in (events or eng.last_events))
        _check(eng)

    a = eng.add_sequence(SYSTEM + "Ada asks about paging")
    did(None)
    b = eng.add_sequence(SYSTEM + "Bo asks about hashing")  # a prefix hit on the trunk
    did(None)
    c = eng.fork(b)
    did(None)
    did(eng.append(c, token_ids=[65, 66, 67]))  # copy-on-write of the shared tail
    for s in (a, b, c):
        did(eng.free(s))
    tree = eng.prefix_tree()
    trunk = [n for n in tree.nodes if n.depth is not None and n.depth < 4]
    assert len({n.block_hash for n in trunk}) == 4  # one trunk, however many prompts
    assert len(tree.children()[trunk[-1].block_hash]) == 2  # a branch per prompt
    big = eng.add_sequence("z" * 68)  # evicts the cached branches into the tier
    did(None)
    did(eng.free(big))
    d = eng.add_sequence(SYSTEM + "Ada asks about paging again")  # loads the trunk back
    did(None)
    assert {"prefix_hit", "share", "cow", "evict", "offload", "load"} <= kinds, kinds
    tree = eng.prefix_tree()
    both = [n for n in tree.nodes if n.block_id is not None and n.tier_slot is not None]
    assert both, "a block copied back stays in the tier too"
    eng.free(d)
    _check(eng)


def test_serving_a_class_grows_one_trunk_and_a_branch_per_student():
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=40))
    for name in ("Ada", "Bo", "Cy", "Di"):
        eng.add_request(SYSTEM + f"{name} wants to know", SamplingParams(max_tokens=4))
    while eng.has_pending_work():
        eng.step()
        _check(eng)
    kids = eng.prefix_tree().children()
    assert len(kids[None]) == 1  # the class's system prompt: one first block
    branching = [h for h, c in kids.items() if h is not None and len(c) == 4]
    assert len(branching) == 1  # the trunk ends where the four prompts part


def test_an_orphan_hangs_under_its_evicted_parent():
    """A sliding window drops a long sequence's first blocks (they stay cached) while it holds
    the later ones, so a new prompt evicts parents whose children are still in use: such a block
    is still a node, marked orphan, under a parent hash that no node has."""
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=18, sliding_window=8))
    eng.add_sequence("abcdefghijklmnopqrstuvwx")
    _check(eng, "sliding")
    eng.add_sequence("0123456789ABCDEF")
    _check(eng, "sliding")
    _check(eng, "full")
    tree = eng.prefix_tree(group="sliding")
    orphans = [n for n in tree.nodes if n.orphan]
    assert [bytes(n.token_ids) for n in orphans] == [b"qrst"]
    assert orphans[0].ref_count == 1 and orphans[0].depth == 4  # its place known all the same
    assert tree.nodes[-2:] == (orphans[0], tree.children()[orphans[0].block_hash][0])


def _chained(tokens: list[int]) -> list[int]:
    """Block hashes of one-token blocks, each chained to the one before (as the engine's are)."""
    out: list[int] = []
    for t in tokens:
        out.append(hash_block(out[-1] if out else None, [t]))
    return out


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=8),
       st.lists(st.integers(0, 12), min_size=1, max_size=30),
       st.lists(st.integers(1, 5), min_size=1, max_size=12))
def test_learning_a_chain_by_its_new_ends_knows_what_learning_it_whole_knows(tails, cuts, steps):
    """`learn` adds only the end of a chain it does not know yet: growing chains taught step by
    step (each a prefix of the next, as a sequence's steps fill one block or a prompt's many;
    several sharing a start) leave the same parents as teaching every chain whole."""
    whole, by_ends = HashChain(), HashChain()
    for tail, cut in zip(tails * 4, cuts, strict=False):
        chain = _chained(tails[0][:cut % (len(tails[0]) + 1)] + tail)
        n = 0
        for step in steps * len(chain):
            n = min(n + step, len(chain))
            by_ends.learn(chain[:n])
        whole.parent.update(zip(chain, [None, *chain], strict=False))
    assert by_ends.parent == whole.parent
