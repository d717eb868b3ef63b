"""Immutable views of the whole engine state, for figures, lessons and checks.

A snapshot is plain frozen data: the UI draws it, lessons read numbers from it, tests compare two
of them. Views of blocks and sequences that did not change since the last snapshot are reused, so
a snapshot of a 4096-block pool costs only what changed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import NamedTuple

from engine.core.block_pool import BlockPool
from engine.core.kv_groups import KVCacheGroup, single_group
from engine.core.offload_tier import OffloadTier
from engine.core.sequence import Sequence, SequenceStatus


class BlockView(NamedTuple):  # a NamedTuple: 4096 of them must build in a few ms
    block_id: int
    ref_count: int
    state: str  # "free" | "used" | "cached"
    block_hash: int | None
    token_ids: tuple[int, ...]
    num_filled: int
    owners: tuple[int, ...]  # seq ids whose block tables point here
    group: str = "full"  # the KV cache group whose layers its page holds


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
    prefill_rest: int  # chunked prefill: prompt tokens not in the cache yet
    # every KV cache group's table by group name ({"full": block_table} for most models); None
    # where a sliding-window group dropped a block (a plain dict: a view pickles)
    block_tables: Mapping[str, tuple[int | None, ...]]


def _with_dicts(obj: object) -> dict:
    """A frozen dataclass's fields, its read-only mappings as plain dicts (which pickle)."""
    return {f.name: dict(v) if isinstance(v := getattr(obj, f.name), MappingProxyType) else v
            for f in fields(obj)}


def _rebuilt(cls: type, state: dict, proxied: tuple[str, ...]) -> object:
    return cls(**{k: MappingProxyType(v) if k in proxied else v for k, v in state.items()})


@dataclass(frozen=True)
class Metrics:
    used_blocks: int
    cached_blocks: int
    free_blocks: int
    logical_blocks: int  # GPU block-table entries: what the tables would take unshared
    prefix_hit_blocks: int  # cumulative
    cow_copies: int  # cumulative
    evictions: int  # cumulative
    num_tokens: int  # tokens in all sequences' caches
    draft_tokens: int = 0  # speculative decoding: draft tokens given slots, cumulative
    accepted_tokens: int = 0  # of them, verified and kept, cumulative
    offloaded_blocks: int = 0  # cached blocks evicted into the CPU tier, cumulative
    offload_hit_blocks: int = 0  # prompt blocks copied back from the CPU tier, cumulative
    dropped_blocks: int = 0  # sliding-window groups: table entries dropped, cumulative
    extra: Mapping[str, float] = field(default_factory=dict)  # serving metrics, filled later

    @property
    def shared_saving(self) -> int:
        """Blocks that sharing saves: table entries minus the blocks backing them."""
        return self.logical_blocks - self.used_blocks

    @property
    def sharing_saving_fraction(self) -> float:
        """The paper's Fig. 15 measure: blocks saved by sharing / blocks needed without it."""
        return self.shared_saving / self.logical_blocks if self.logical_blocks else 0.0

    def __reduce__(self) -> tuple:  # read-only mappings do not pickle: as dicts, and back
        return _rebuilt, (type(self), _with_dicts(self), ("extra",))


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
    kv_cache_groups: tuple[KVCacheGroup, ...] = single_group()  # the tables every sequence has
    # the prefix cache's CPU tier (num_offload_blocks): one view per slot, block_id = the slot,
    # "cached" where it holds an evicted block (its hash and tokens), "free" otherwise
    tier_blocks: tuple[BlockView, ...] = ()
    tier_lru: tuple[int, ...] = ()  # held tier slots, the next to be overwritten first

    def __reduce__(self) -> tuple:  # a snapshot pickles (a ZeroGPU call returns them)
        return _rebuilt, (type(self), _with_dicts(self), ("sequences",))


class PoolViews:
    """The views of one pool's blocks, rebuilt for the blocks its change log names."""

    def __init__(self, pool: BlockPool, names: tuple[str, ...]) -> None:
        self.pool = pool
        self.names = names
        self.views: list[BlockView | None] = [None] * pool.num_blocks
        self.mark = -1  # nothing read yet: the first read builds every block

    def read(self) -> tuple[BlockView, ...]:
        pool, views, make, names = self.pool, self.views, BlockView, self.names
        changed, self.mark = pool.changes_since(self.mark)
        blocks = pool.blocks
        for b in range(pool.num_blocks) if changed is None else set(changed):
            blk = blocks[b]  # the hot loop of a cold snapshot: 4096 blocks in a few ms
            rc, h, toks = blk.ref_count, blk.block_hash, blk.token_ids
            state = "used" if rc else ("free" if h is None else "cached")
            views[b] = make(b, rc, state, h, tuple(toks), len(toks), tuple(blk.owners),
                            names[blk.group])
        return tuple(views)  # type: ignore[arg-type]


class SnapshotBuilder:
    """Builds snapshots, reusing the views of blocks and sequences that did not change."""

    def __init__(self, pool: BlockPool, decode: Callable[[list[int]], str],
                 cpu_pool: BlockPool | None = None,
                 groups: tuple[KVCacheGroup, ...] = single_group(),
                 tier: OffloadTier | None = None) -> None:
        self.pool = pool
        self.cpu_pool = cpu_pool
        self.tier = tier
        self._tier: tuple[int, tuple[BlockView, ...], tuple[int, ...]] = (-1, (), ())
        self.decode = decode
        self.groups = groups
        self._names = tuple(g.name for g in groups)
        self._blocks = PoolViews(pool, self._names)
        self._cpu_blocks = PoolViews(cpu_pool, self._names) if cpu_pool is not None else None
        self._seqs: dict[int, tuple[tuple, SequenceView]] = {}

    def block_views(self) -> tuple[BlockView, ...]:
        return self._blocks.read()

    def tier_views(self) -> tuple[tuple[BlockView, ...], tuple[int, ...]]:
        """The tier's slots and LRU order, rebuilt only when the tier changed."""
        tier = self.tier
        if tier is None or not tier.num_blocks:
            return (), ()
        if self._tier[0] != tier.version:
            views = tuple(BlockView(slot, 0, "free" if h is None else "cached", h, toks,
                                    len(toks), ()) for slot, h, toks in tier.slots())
            self._tier = (tier.version, views, tier.lru())
        return self._tier[1], self._tier[2]

    def sequence_view(self, seq: Sequence) -> SequenceView:
        tables = tuple(map(tuple, seq.block_tables))
        key = (seq.num_tokens, tables, seq.pending_token, seq.status, seq.loading,
               seq.num_cached_tokens, len(seq.prefill_rest))
        cached = self._seqs.get(seq.seq_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        if len(tables) < len(self._names):  # not allocated yet: every group's table is empty
            tables = tables + ((),) * (len(self._names) - len(tables))
        view = SequenceView(
            seq.seq_id, tables[0], tuple(seq.token_ids), seq.num_tokens,
            # "loading": its prefix blocks come back from the CPU tier this step
            self.decode(seq.token_ids), "loading" if seq.loading else seq.status.value,
            seq.num_cached_tokens,
            seq.pending_token, seq.prompt_len, seq.parent_id, len(seq.prefill_rest),
            dict(zip(self._names, tables, strict=True)),
        )
        self._seqs[seq.seq_id] = (key, view)
        return view

    def build(self, step: int, sequences: list[Sequence], counters: dict[str, int],
              mode: str, extra: Mapping[str, float] | None = None) -> Snapshot:
        pool = self.pool
        sliding = any(g.sliding for g in self.groups)
        blocks = self.block_views()
        cpu = self._cpu_blocks.read() if self._cpu_blocks is not None else ()
        tier_blocks, tier_lru = self.tier_views()
        seq_views = {s.seq_id: self.sequence_view(s) for s in sequences}
        for gone in set(self._seqs) - set(seq_views):
            del self._seqs[gone]
        n_cached, n_free = len(pool.cached_ids), len(pool.free_ids)
        metrics = Metrics(
            used_blocks=pool.num_blocks - n_cached - n_free,
            cached_blocks=n_cached,
            free_blocks=n_free,
            # a swapped-out sequence's table points at CPU blocks: no GPU block backs it
            logical_blocks=sum(len(t) - t.count(None) if sliding else len(t)
                               for s in sequences if s.status is not SequenceStatus.SWAPPED
                               for t in s.block_tables),
            num_tokens=sum(s.num_tokens for s in sequences),
            extra=MappingProxyType(dict(extra or {})),
            **counters,
        )
        return Snapshot(
            step=step, block_size=pool.block_size, num_blocks=pool.num_blocks, blocks=blocks,
            sequences=MappingProxyType(seq_views), metrics=metrics,
            num_free_blocks=n_cached + n_free, cached_lru=tuple(pool.cached_ids), mode=mode,
            cpu_blocks=cpu, kv_cache_groups=self.groups, tier_blocks=tier_blocks,
            tier_lru=tier_lru,
        )
