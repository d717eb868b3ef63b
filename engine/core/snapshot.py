"""Immutable views of the whole engine state, for figures, lessons and checks.

A snapshot is plain frozen data: the UI draws it, lessons read numbers from it, tests compare two
of them. Views of blocks and sequences that did not change since the last snapshot are reused, so
a snapshot of a 4096-block pool costs only what changed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from engine.core.block_pool import BlockPool
from engine.core.sequence import Sequence


class BlockView(NamedTuple):  # a NamedTuple: 4096 of them must build in a few ms
    block_id: int
    ref_count: int
    state: str  # "free" | "used" | "cached"
    block_hash: int | None
    token_ids: tuple[int, ...]
    num_filled: int
    owners: tuple[int, ...]  # seq ids whose block tables point here


class SequenceView(NamedTuple):
    seq_id: int
    block_table: tuple[int, ...]
    token_ids: tuple[int, ...]
    num_tokens: int
    text: str
    status: str
    num_cached_tokens: int  # prompt tokens served by the prefix cache
    pending_token: int | None
    prompt_len: int
    parent_id: int | None
    prefill_rest: int = 0  # chunked prefill: prompt tokens not in the cache yet


@dataclass(frozen=True)
class Metrics:
    used_blocks: int
    cached_blocks: int
    free_blocks: int
    logical_blocks: int  # sum of block-table lengths: what the tables would take unshared
    prefix_hit_blocks: int  # cumulative
    cow_copies: int  # cumulative
    evictions: int  # cumulative
    num_tokens: int  # tokens in all sequences' caches
    draft_tokens: int = 0  # speculative decoding: draft tokens given slots, cumulative
    accepted_tokens: int = 0  # of them, verified and kept, cumulative
    offloaded_blocks: int = 0  # cached blocks evicted into the CPU tier, cumulative
    offload_hit_blocks: int = 0  # prompt blocks copied back from the CPU tier, cumulative
    extra: Mapping[str, float] = field(default_factory=dict)  # serving metrics, filled later

    @property
    def shared_saving(self) -> int:
        """Blocks that sharing saves: table entries minus the blocks backing them."""
        return self.logical_blocks - self.used_blocks

    @property
    def sharing_saving_fraction(self) -> float:
        """The paper's Fig. 15 measure: blocks saved by sharing / blocks needed without it."""
        return self.shared_saving / self.logical_blocks if self.logical_blocks else 0.0


@dataclass(frozen=True)
class Snapshot:
    step: int
    block_size: int
    num_blocks: int
    blocks: tuple[BlockView, ...]
    sequences: Mapping[int, SequenceView]
    metrics: Metrics
    num_free_blocks: int  # allocatable now: free + cached
    cached_lru: tuple[int, ...]  # cached block ids, next to be evicted first
    mode: str  # "dry" or the model's name
    cpu_blocks: tuple[BlockView, ...] = ()  # CPU swap space (swapped sequences' blocks)


class SnapshotBuilder:
    """Builds snapshots, reusing the views of blocks and sequences that did not change."""

    def __init__(self, pool: BlockPool, decode: Callable[[list[int]], str],
                 cpu_pool: BlockPool | None = None) -> None:
        self.pool = pool
        self.cpu_pool = cpu_pool
        self.decode = decode
        self._blocks: list[BlockView | None] = [None] * pool.num_blocks
        self._cpu_blocks: list[BlockView | None] = [None] * (cpu_pool.num_blocks if cpu_pool else 0)
        self._seqs: dict[int, tuple[tuple, SequenceView]] = {}

    def block_views(self, pool: BlockPool | None = None, views: list | None = None
                    ) -> tuple[BlockView, ...]:
        pool = pool or self.pool
        views = self._blocks if views is None else views
        blocks, make = pool.blocks, BlockView
        for b in pool.dirty:  # the hot loop of a cold snapshot: 4096 blocks in a few ms
            blk = blocks[b]
            rc, h, toks = blk.ref_count, blk.block_hash, blk.token_ids
            state = "used" if rc else ("free" if h is None else "cached")
            views[b] = make(b, rc, state, h, tuple(toks), len(toks), tuple(blk.owners))
        pool.dirty.clear()
        return tuple(views)

    def sequence_view(self, seq: Sequence) -> SequenceView:
        key = (seq.num_tokens, tuple(seq.block_table), seq.pending_token, seq.status,
               seq.num_cached_tokens, len(seq.prefill_rest))
        cached = self._seqs.get(seq.seq_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        view = SequenceView(
            seq.seq_id, tuple(seq.block_table), tuple(seq.token_ids), seq.num_tokens,
            self.decode(seq.token_ids), seq.status.value, seq.num_cached_tokens,
            seq.pending_token, seq.prompt_len, seq.parent_id, len(seq.prefill_rest),
        )
        self._seqs[seq.seq_id] = (key, view)
        return view

    def build(self, step: int, sequences: list[Sequence], counters: dict[str, int],
              mode: str, extra: Mapping[str, float] | None = None) -> Snapshot:
        pool = self.pool
        blocks = self.block_views()
        cpu = self.block_views(self.cpu_pool, self._cpu_blocks) if self.cpu_pool else ()
        seq_views = {s.seq_id: self.sequence_view(s) for s in sequences}
        for gone in set(self._seqs) - set(seq_views):
            del self._seqs[gone]
        n_cached, n_free = len(pool.cached_ids), len(pool.free_ids)
        metrics = Metrics(
            used_blocks=pool.num_blocks - n_cached - n_free,
            cached_blocks=n_cached,
            free_blocks=n_free,
            logical_blocks=sum(len(s.block_table) for s in sequences),
            num_tokens=sum(s.num_tokens for s in sequences),
            extra=MappingProxyType(dict(extra or {})),
            **counters,
        )
        return Snapshot(
            step=step, block_size=pool.block_size, num_blocks=pool.num_blocks, blocks=blocks,
            sequences=MappingProxyType(seq_views), metrics=metrics,
            num_free_blocks=n_cached + n_free, cached_lru=tuple(pool.cached_ids), mode=mode,
            cpu_blocks=cpu,
        )
