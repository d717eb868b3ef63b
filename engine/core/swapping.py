"""Preemption by swap (the paper's §4.5): a request group's blocks move to CPU swap space and back.

A part of `KVCacheManager` (engine/core/kv_cache_manager.py), which it extends: it uses the
manager's GPU pool, its CPU pool (swap space, never hashed) and `_allocate`. Every block of every
KV cache group's table moves; a table's dropped (None) entries stay None; a block keeps its group.
"""

from __future__ import annotations

from typing import Any

from engine.core.block_pool import BlockPool
from engine.core.events import Event
from engine.core.sequence import Sequence, SequenceStatus


class Swapping:
    """The swap operations of the KV cache manager."""

    pool: BlockPool
    cpu_pool: BlockPool
    enable_prefix_caching: bool
    step: int
    _allocate: Any
    _require: Any

    @staticmethod
    def distinct_blocks(seqs: list[Sequence]) -> list[int]:
        """The blocks of a group's tables, each once (its sequences may share blocks)."""
        return list(dict.fromkeys(b for s in seqs for t in s.block_tables for b in t
                                  if b is not None))

    def swap_out(self, seqs: list[Sequence]) -> tuple[list[Event], list[tuple[int, int]]]:
        """Move a group's blocks to CPU swap space. Returns events and (gpu, cpu) copy pairs;
        the caller copies the bytes before anyone reuses the GPU blocks."""
        gpu_blocks = self.distinct_blocks(seqs)
        self._require(len(gpu_blocks), self.cpu_pool.num_allocatable, "swapping out")
        pairs, events = self._move(seqs, gpu_blocks, self.pool, self.cpu_pool)
        for seq in seqs:
            seq.status = SequenceStatus.SWAPPED
        events.append(Event("swap_out", self.step, seqs[0].seq_id,
                            tuple(x for p in pairs for x in p),
                            facts=tuple(s.seq_id for s in seqs)))
        return events, pairs

    def swap_in(self, seqs: list[Sequence]) -> tuple[list[Event], list[tuple[int, int]]]:
        """Bring a swapped group back into the GPU pool. Returns events and (cpu, gpu) pairs."""
        cpu_blocks = self.distinct_blocks(seqs)
        self._require(len(cpu_blocks), self.pool.num_allocatable, "swapping in")
        pairs, events = self._move(seqs, cpu_blocks, self.cpu_pool, self.pool)
        for seq in seqs:
            seq.status = SequenceStatus.RUNNING
            if self.enable_prefix_caching:  # full blocks become findable again
                for i, h in enumerate(seq.block_hashes):
                    for table in seq.block_tables:
                        if table[i] is not None:
                            self.pool.register_hash(table[i], h)
        events.append(Event("swap_in", self.step, seqs[0].seq_id,
                            tuple(x for p in pairs for x in p),
                            facts=tuple(s.seq_id for s in seqs)))
        return events, pairs

    def _move(self, seqs: list[Sequence], src_blocks: list[int], src: BlockPool, dst: BlockPool
              ) -> tuple[list[tuple[int, int]], list[Event]]:
        events: list[Event] = []
        mapping: dict[int, int] = {}
        for b in src_blocks:
            owner = next(s.seq_id for s in seqs if any(b in t for t in s.block_tables))
            group = src.blocks[b].group
            if dst is self.pool:
                new = self._allocate(owner, events, narrate=False, group=group)
            else:
                new, _ = dst.allocate(owner, group)
            dst.blocks[new].token_ids = list(src.blocks[b].token_ids)
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
