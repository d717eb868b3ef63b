"""The prefix cache's CPU tier, seen from the block tables: a prompt whose prefix runs on past the
GPU pool's hits into blocks the tier holds (engine/core/offload_tier.py) gets a GPU block for
each, hashed again, and its K/V copied back before the forward pass (the runtime's `load`).

A part of `KVCacheManager` (engine/core/kv_cache_manager.py), which it extends: it uses the
manager's pool, tier, `_allocate` and step. Models with one KV cache group only (the engine
refuses the tier for hybrid models).
"""

from __future__ import annotations

from typing import Any

from engine.core.events import Event
from engine.core.offload_tier import OffloadTier
from engine.core.sequence import Sequence


class TierLoads:
    """The tier operations of the KV cache manager."""

    pool: Any
    tier: OffloadTier
    block_size: int
    enable_prefix_caching: bool
    hash_fn: Any
    step: int
    _loading: tuple[int, set[int]]
    _allocate: Any

    def _match_tier(self, prompt: list[int], hashes: list[int]) -> list[tuple[int, int]]:
        if not self.enable_prefix_caching or not self.tier.num_blocks:
            return []
        return self.tier.match(prompt, hashes[-1] if hashes else None, len(hashes),
                               self.block_size, self.hash_fn)

    def _load(self, seq: Sequence, prompt: list[int], loads: list[tuple[int, int]],
              events: list[Event]) -> None:
        """Blocks the tier holds become the sequence's next blocks: a GPU block each (the
        caller counted them), hashed again, their K/V copied back before the model runs."""
        bs, sid = self.block_size, seq.seq_id
        self._pinned().update(slot for slot, _ in loads)  # no offload may overwrite them now
        blocks = []
        for _, h in loads:
            i = len(seq.block_table)
            block_id = self._allocate(sid, events, narrate=False)
            chunk = prompt[i * bs:(i + 1) * bs]
            self.pool.blocks[block_id].token_ids = list(chunk)
            self.pool.register_hash(block_id, h)
            seq.block_table.append(block_id)
            seq.block_hashes.append(h)
            seq.token_ids += chunk
            blocks.append(block_id)
        seq.num_cached_tokens += len(loads) * bs
        self.tier.hit_blocks += len(loads)
        events.append(Event("load", self.step, sid, tuple(blocks),
                            facts=(tuple(slot for slot, _ in loads), len(loads) * bs)))

    def _pinned(self) -> set[int]:
        """The tier slots this step's loads read (the runtime offloads first, then loads)."""
        if self._loading[0] != self.step:
            self._loading = (self.step, set())
        return self._loading[1]

