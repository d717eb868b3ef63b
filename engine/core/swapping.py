"""Preemption by swap (the paper's §4.5): a request group's blocks move to CPU swap space and back.

A component of `KVCacheManager` (engine/core/kv_cache_manager.py), which owns it and calls it: it
works on the GPU pool through the manager's `BlockWriter` (a block taken back from the GPU pool
may evict a cached one) and on the CPU pool (swap space, never hashed) directly. Every block of
every KV cache group's table moves; a table's dropped (None) entries stay None; a block keeps its
group. Each moved block is recorded as a copy for the device (`BlockCopy`), in the order made.
"""

from __future__ import annotations

from engine.core.block_pool import BlockPool
from engine.core.block_writer import BlockWriter
from engine.core.copy_plan import BlockCopy
from engine.core.events import Event, Swapped
from engine.core.sequence import Sequence, SequenceStatus


def distinct_blocks(seqs: list[Sequence]) -> list[int]:
    """The blocks of a group's tables, each once (its sequences may share blocks)."""
    return list(dict.fromkeys(b for s in seqs for t in s.block_tables for b in t if b is not None))


class Swapping:
    """The swap operations of the KV cache manager (no state of its own: the pools hold it)."""

    STATE = ()
    FIXED = ("writer", "pool", "cpu_pool")

    def __init__(self, writer: BlockWriter, cpu_pool: BlockPool) -> None:
        self.writer = writer
        self.pool = writer.pool
        self.cpu_pool = cpu_pool

    def swap_out(self, seqs: list[Sequence]) -> tuple[list[Event], list[tuple[int, int]]]:
        """Move a group's blocks to CPU swap space. Returns events and (gpu, cpu) pairs; the
        device copies the bytes (recorded copies) before anyone reuses the GPU blocks."""
        gpu_blocks = distinct_blocks(seqs)
        self.writer.require(len(gpu_blocks), self.cpu_pool.num_allocatable, "swapping out")
        pairs, events = self._move(seqs, gpu_blocks, self.pool, self.cpu_pool)
        for seq in seqs:
            seq.status = SequenceStatus.SWAPPED
        self._moved("swap_out", seqs, pairs, events)
        return events, pairs

    def swap_in(self, seqs: list[Sequence]) -> tuple[list[Event], list[tuple[int, int]]]:
        """Bring a swapped group back into the GPU pool. Returns events and (cpu, gpu) pairs."""
        cpu_blocks = distinct_blocks(seqs)
        self.writer.require(len(cpu_blocks), self.pool.num_allocatable, "swapping in")
        pairs, events = self._move(seqs, cpu_blocks, self.cpu_pool, self.pool)
        for seq in seqs:
            seq.status = SequenceStatus.RUNNING
            if self.writer.enable_prefix_caching:  # full blocks become findable again
                for i, h in enumerate(seq.block_hashes):
                    for table in seq.block_tables:
                        if table[i] is not None:
                            self.pool.register_hash(table[i], h)
        self._moved("swap_in", seqs, pairs, events)
        return events, pairs

    def _moved(self, kind: str, seqs: list[Sequence], pairs: list[tuple[int, int]],
               events: list[Event]) -> None:
        w = self.writer
        w.copies += (BlockCopy(kind, src, dst) for src, dst in pairs)
        events.append(Event(kind, w.step, seqs[0].seq_id, tuple(x for p in pairs for x in p),
                            facts=Swapped(tuple(s.seq_id for s in seqs))))

    def _move(self, seqs: list[Sequence], src_blocks: list[int], src: BlockPool, dst: BlockPool
              ) -> tuple[list[tuple[int, int]], list[Event]]:
        events: list[Event] = []
        mapping: dict[int, int] = {}
        for b in src_blocks:
            owner = next(s.seq_id for s in seqs if any(b in t for t in s.block_tables))
            group = src.blocks[b].group
            if dst is self.pool:
                new = self.writer.allocate(owner, events, narrate=False, group=group)
            else:
                new, _ = dst.allocate(owner, group)
            dst.set_tokens(new, src.blocks[b].token_ids)
            mapping[b] = new
        for seq in seqs:
            for table in seq.block_tables:
                for b in reversed(table):
                    if b is not None:
                        src.decref(b, seq.seq_id)
            seq.block_tables = [[None if b is None else mapping[b] for b in t]
                                for t in seq.block_tables]
            for table in seq.block_tables:
                for b in table:
                    if b is not None and seq.seq_id not in dst.blocks[b].owners:
                        dst.incref(b, seq.seq_id)
        return list(mapping.items()), events
