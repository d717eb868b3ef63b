"""The prefix cache's CPU tier, seen from the block tables: a prompt whose prefix runs on past the
GPU pool's hits into blocks the tier holds (engine/core/offload_tier.py) gets a GPU block for
each, hashed again, and its K/V copied back before the forward pass (the runtime's `load`).

A component of `KVCacheManager` (engine/core/kv_cache_manager.py), which owns it and calls it
while it allocates a prompt: it takes GPU blocks through the manager's `BlockWriter` and records
each load as a copy for the device. Models with one KV cache group only (the engine refuses the
tier for hybrid models).

A load's bytes need the bus, the slowest move of the step (a 4,096-token prefix of a 1B model:
~2.4 ms at 54 GB/s), and nothing but the choice of slots decides them: `fetch` (the runtime's
`fetch_ahead`) hears the slots as soon as they are chosen, before the blocks are taken and
evicted for them, so the copy over the bus runs beside the rest of the schedule. The copy it
starts reads the slots as they are; a slot an offload of the step writes first is read again.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.core.block_writer import BlockWriter
from engine.core.copy_plan import BlockCopy
from engine.core.events import Event, Loaded
from engine.core.offload_tier import OffloadTier
from engine.core.sequence import Sequence

_new = tuple.__new__  # a NamedTuple straight from its fields' tuple: hundreds a load


class TierLoads:
    """The tier operations of the KV cache manager (no state of its own: the tier holds it)."""

    STATE = ()
    FIXED = ("writer", "tier", "fetch")

    def __init__(self, writer: BlockWriter, tier: OffloadTier,
                 fetch: Callable[[list[int]], None] | None = None) -> None:
        self.writer = writer
        self.tier = tier
        self.fetch = fetch or _nothing

    def match(self, prompt: list[int], hashes: list[int], most: int | None = None
              ) -> list[tuple[int, int]]:
        """(slot, hash) of the prompt's full blocks after its GPU hits (`hashes`) that the tier
        holds, up to the first miss (and at most `most`)."""
        w = self.writer
        if not w.enable_prefix_caching or not self.tier.num_blocks:
            return []
        return self.tier.match(prompt, hashes[-1] if hashes else None, len(hashes),
                               w.block_size, w.hash_fn, most)

    def touch(self, found: list[tuple[int, int]]) -> None:
        """The tier's hits the caller is sure to take (`match`'s, in order) become its most
        recently used entries: after the checks that may refuse the operation, not in them."""
        self.tier.touch([h for _, h in found])

    def load(self, seq: Sequence, prompt: list[int], loads: list[tuple[int, int]],
             events: list[Event]) -> None:
        """Blocks the tier holds become the sequence's next blocks: a GPU block each (the
        caller counted them), hashed again, their K/V copied back before the model runs."""
        w = self.writer
        bs, sid, pool = w.block_size, seq.seq_id, w.pool
        slots = [slot for slot, _ in loads]
        self.tier.pinned(w.step).update(slots)  # no offload of this step may overwrite them
        self.fetch(slots)  # over the bus now, beside the allocation and evictions below
        blocks = w.take_blocks(sid, [0] * len(loads), events)
        start = len(seq.block_table)
        chunks = [prompt[i * bs:(i + 1) * bs] for i in range(start, start + len(loads))]
        pool.fill_blocks(blocks, chunks, 1)
        hashes = [h for _, h in loads]
        pool.register_many(blocks, hashes)
        seq.block_tables[0].extend(blocks)
        seq.block_hashes += hashes
        seq.token_ids += prompt[start * bs:(start + len(loads)) * bs]
        seq.num_cached_tokens += len(loads) * bs
        self.tier.hit_blocks += len(loads)
        w.copies += [_new(BlockCopy, ("load", slot, b)) for slot, b in zip(slots, blocks, strict=True)]
        events.append(Event("load", w.step, sid, tuple(blocks), facts=Loaded(tuple(slots), len(loads) * bs)))


def _nothing(slots: list[int]) -> None:
    """No runtime to tell (a manager on its own): the copies run when the step's copies do."""
