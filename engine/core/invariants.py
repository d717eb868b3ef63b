"""The bookkeeping's invariants (ARCHITECTURE.md: ref count = table entries; free, cached and used
disjoint and complete; hashed blocks full; tables cover exactly their tokens; no draft slot
outlives its step; a sliding-window group holds exactly the blocks its window can still see),
checked after operations in tests and on demand."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq

from engine.core.block_pool import BlockPool
from engine.core.kv_groups import KVCacheGroup, dead_blocks, single_group
from engine.core.sequence import Sequence


class InvariantError(AssertionError):
    """The bookkeeping contradicts itself. Always a bug in the engine."""


def check_pool(pool: BlockPool, sequences: list[Sequence], bs: int, where: str,
               groups: Seq[KVCacheGroup] = single_group()) -> None:
    """Raise InvariantError where the pool's ref counts, owners, queues or hashes contradict
    the sequences' block tables (`where` prefixes the message: "cpu " for swap space)."""

    def fail(msg: str) -> None:
        raise InvariantError(where + msg)

    refs = [0] * pool.num_blocks
    owners: list[set[int]] = [set() for _ in range(pool.num_blocks)]
    for seq in sequences:
        if seq.num_draft:
            fail(f"seq {seq.seq_id}: {seq.num_draft} draft slots outlived their step")
        if len(seq.block_tables) != len(groups):
            fail(f"seq {seq.seq_id}: {len(seq.block_tables)} block tables for {len(groups)} groups")
        held = [b for t in seq.block_tables for b in t if b is not None]
        if len(set(held)) != len(held):
            fail(f"seq {seq.seq_id}: a block appears twice in its tables {seq.block_tables}")
        for g, (group, table) in enumerate(zip(groups, seq.block_tables, strict=True)):
            _check_table(seq, table, g, group, pool, bs, fail)
            for b in table:
                if b is not None:
                    refs[b] += 1
                    owners[b].add(seq.seq_id)
    free, cached = set(pool.free_ids), set(pool.cached_ids)
    if len(free) != len(pool.free_ids) or free & cached:
        fail("free queue and cached LRU overlap or repeat a block")
    for block in pool.blocks:
        b = block.block_id
        if block.ref_count != refs[b]:
            fail(f"block {b}: ref count {block.ref_count}, but {refs[b]} table entries")
        if set(block.owners) != owners[b]:
            fail(f"block {b}: owners {sorted(block.owners)} != tables {sorted(owners[b])}")
        state = block.state
        if (state == "free") != (b in free) or (state == "cached") != (b in cached):
            fail(f"block {b}: state {state} but queue membership disagrees")
        if block.block_hash is not None and len(block.token_ids) != bs:
            fail(f"block {b}: hashed but only {len(block.token_ids)} of {bs} slots filled")


def _check_table(seq: Sequence, table: list[int | None], g: int, group: KVCacheGroup,
                 pool: BlockPool, bs: int, fail: Callable[[str], None]) -> None:
    """One group's table: as long as the tokens need, each block of this group holding its
    tokens, and None exactly where the group's window has passed (nowhere without a window)."""
    name = f"seq {seq.seq_id} ({group.name} table)"
    if len(table) != -(-seq.num_tokens // bs):
        fail(f"{name}: {seq.num_tokens} tokens in {len(table)} blocks")
    dead = dead_blocks(seq.num_tokens, group.window, bs, len(table))
    for i, b in enumerate(table):
        if (b is None) != (i < dead):
            fail(f"{name}: entry {i} is {b}, but the window leaves {dead} dropped entries")
        if b is None:
            continue
        if pool.blocks[b].group != g:
            fail(f"{name}: block {b} belongs to group {pool.blocks[b].group}")
        if pool.blocks[b].token_ids != seq.token_ids[i * bs:(i + 1) * bs]:
            fail(f"{name}: block {b} does not hold its tokens {i * bs}..")
