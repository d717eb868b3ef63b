"""The bookkeeping's invariants (DESIGN: ref count = table entries; free, cached and used
disjoint and complete; hashed blocks full; tables cover exactly their tokens; no draft slot
outlives its step), checked after operations in tests and on demand."""

from __future__ import annotations

from engine.core.block_pool import BlockPool
from engine.core.sequence import Sequence


class InvariantError(AssertionError):
    """The bookkeeping contradicts itself. Always a bug in the engine."""


def check_pool(pool: BlockPool, sequences: list[Sequence], bs: int, where: str) -> None:
    """Raise InvariantError where the pool's ref counts, owners, queues or hashes contradict
    the sequences' block tables (`where` prefixes the message: "cpu " for swap space)."""

    def fail(msg: str) -> None:
        raise InvariantError(where + msg)

    refs = [0] * pool.num_blocks
    owners: list[set[int]] = [set() for _ in range(pool.num_blocks)]
    for seq in sequences:
        if seq.num_draft:
            fail(f"seq {seq.seq_id}: {seq.num_draft} draft slots outlived their step")
        table = seq.block_table
        if len(table) != -(-seq.num_tokens // bs):
            fail(f"seq {seq.seq_id}: {seq.num_tokens} tokens in {len(table)} blocks")
        if len(set(table)) != len(table):
            fail(f"seq {seq.seq_id}: a block appears twice in its table {table}")
        for i, b in enumerate(table):
            refs[b] += 1
            owners[b].add(seq.seq_id)
            if pool.blocks[b].token_ids != seq.token_ids[i * bs:(i + 1) * bs]:
                fail(f"seq {seq.seq_id}: block {b} does not hold its tokens {i * bs}..")
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
