"""Admitting a request of several sequences at once (a sample or beam group resuming after a
recompute preemption): every sequence gets its blocks, or none does and nothing changed.

`KVCacheManager.allocate` is all or nothing for one sequence: it counts before it touches. A group
cannot be counted that way, because its sequences' allocations depend on each other (a later one
hits blocks an earlier one hashed; an earlier one's allocation may evict a block a later one would
have hit). So the group is allocated one sequence after the other from a saved copy of the
bookkeeping, and put back exactly when one does not fit. A partial admission left undone would
leave the earlier sequences' new blocks hashed with K/V never computed (a later prompt's prefix
hit on them reads bytes nobody wrote) and their evictions' copies to the CPU tier never made.
"""

from __future__ import annotations

from typing import Any

from engine.core.block_pool import OutOfBlocks
from engine.core.events import Event
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.sequence import Sequence

_SEQ_FIELDS = ("block_tables", "token_ids", "block_hashes", "num_cached_tokens", "status")


def _copied(value: Any) -> Any:
    """A sequence field's value, its lists copied (a block table is a list of lists)."""
    if isinstance(value, list):
        return [_copied(v) for v in value]
    return value


def allocate_together(kv: KVCacheManager, seqs: list[Sequence], prompts: list[list[int]]) -> list[Event]:
    """`kv.allocate` for each sequence with its prompt, all or nothing:
    raises OutOfBlocks with the pools, the tier and the sequences as they were."""
    if len(seqs) == 1:
        return kv.allocate(seqs[0], prompts[0])
    saved = kv.state()  # the pools, the tier, the counters and the copies recorded so far
    old = [[_copied(getattr(s, f)) for f in _SEQ_FIELDS] for s in seqs]
    events: list[Event] = []
    try:
        for seq, prompt in zip(seqs, prompts, strict=True):
            events += kv.allocate(seq, prompt)
    except OutOfBlocks:
        kv.load_state(saved)  # in place: snapshots and the scheduler hold the pool
        for seq, values in zip(seqs, old, strict=True):
            for name, value in zip(_SEQ_FIELDS, values, strict=True):
                setattr(seq, name, value)
        raise
    return events
