"""A CPU tier for the prefix cache (vLLM's offloading connector, LMCache): a full, hashed block
evicted from the GPU pool keeps its K/V here, and a later prompt whose prefix misses the GPU pool
but hits the tier copies the block back instead of recomputing it.

The tier holds `num_blocks` slots of CPU memory, each one block's K/V in every layer, found by
the block's chained hash (the tokens are kept too: a hash collision must not serve a wrong
block). Least recently used first out: storing into a full tier overwrites the slot of the entry
used longest ago; a hit makes an entry the most recent. A block copied back stays in the tier
(its bytes are still right), so a prefix evicted again costs no second copy. Torch-free: the
bytes move in the runtime (`offload` / `load`), driven by the events this bookkeeping causes.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable

from engine.core.state import fields_state, load_fields


class OffloadTier:
    STATE = ("free_slots", "entries", "offloaded_blocks", "hit_blocks", "_loading")
    FIXED = ("num_blocks",)
    DERIVED = ("version",)

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free_slots: deque[int] = deque(range(num_blocks))
        self.entries: OrderedDict[int, tuple[int, tuple[int, ...]]] = OrderedDict()  # hash -> (slot, tokens)
        self.offloaded_blocks = 0  # blocks copied in, cumulative
        self.hit_blocks = 0  # blocks copied back for a prefix, cumulative
        self.version = 0  # changes whenever an entry or the LRU order does (snapshots reuse views)
        self._loading: tuple[int, set[int]] = (-1, set())  # (step, the slots its loads read)

    def __len__(self) -> int:
        return len(self.entries)

    def store(self, block_hash: int, token_ids: list[int], pinned: set[int] = frozenset()
              ) -> int | None:
        """The slot to copy an evicted block into (the least recently used entry's when the tier
        is full, but never a `pinned` one: a load reads it this step), or None when there is no
        such slot or the tier holds this block already (then it only becomes the most recent)."""
        return self.store_many([(block_hash, token_ids)], pinned)[0]

    def store_many(self, blocks: list[tuple[int, list[int]]], pinned: set[int] = frozenset()
                   ) -> list[int | None]:
        """`store` for each (hash, tokens) in turn, as one operation: a long prompt evicts
        hundreds of blocks in a step, and each call's overhead was a third of the work."""
        if not self.num_blocks:
            return [None] * len(blocks)
        self.version += 1
        entries, free, slots = self.entries, self.free_slots, []
        for block_hash, token_ids in blocks:
            if block_hash in entries:
                entries.move_to_end(block_hash)
                slots.append(None)
                continue
            if free:
                slot = free.popleft()
            else:
                victim, (slot, held) = entries.popitem(last=False)  # the least recently used...
                if slot in pinned:  # ...unless a load reads it: it keeps its place
                    entries[victim] = (slot, held)
                    entries.move_to_end(victim, last=False)
                    victim = next((h for h, (s, _) in entries.items() if s not in pinned), None)
                    if victim is None:
                        slots.append(None)
                        continue
                    slot, _ = entries.pop(victim)
            entries[block_hash] = (slot, tuple(token_ids))
            slots.append(slot)
        self.offloaded_blocks += len(slots) - slots.count(None)
        return slots

    def state(self) -> dict:
        """Everything the tier holds, as plain data (its size is fixed at construction)."""
        return fields_state(self)

    def load_state(self, state: dict) -> None:
        """Back to `state` (from `state()`). The version moves on, never back: a view built
        from a later state must not pass for this one."""
        load_fields(self, state)
        self.version += 1

    def pinned(self, step: int) -> set[int]:
        """The slots step `step`'s loads read (its copies offload first, then load): no offload
        of that step may be handed one of them."""
        if self._loading[0] != step:
            self._loading = (step, set())
        return self._loading[1]

    def find(self, block_hash: int, token_ids: list[int]) -> int | None:
        """The slot holding exactly these tokens under this hash, or None. The LRU order is not
        touched: an operation that finds blocks here may still be refused (the pool too small
        for the rest of the prompt), and a refused operation changes nothing; its hits become
        the most recent (`touch`) once it is sure to take them."""
        entry = self.entries.get(block_hash)
        if entry is None or entry[1] != tuple(token_ids):
            return None
        return entry[0]

    def touch(self, hashes: list[int]) -> None:
        """These entries, in order, become the most recently used (a prefix's hits, taken)."""
        if hashes:
            for h in hashes:
                self.entries.move_to_end(h)
            self.version += 1

    def match(self, prompt: list[int], parent: int | None, start: int, block_size: int,
              hash_fn: Callable[[int | None, list[int]], int], most: int | None = None
              ) -> list[tuple[int, int]]:
        """The prompt's full blocks from block `start` on (chained from `parent`, the hash of
        the block before) that the tier holds, as (slot, hash), up to the first miss (at most
        `most` of them); at least one prompt token is left to compute. Nothing changes here."""
        found: list[tuple[int, int]] = []
        end = (len(prompt) - 1) // block_size
        if most is not None:
            end = min(end, start + most)
        for i in range(start, end):
            chunk = prompt[i * block_size:(i + 1) * block_size]
            h = hash_fn(parent, chunk)
            slot = self.find(h, chunk)
            if slot is None:
                break
            found.append((slot, h))
            parent = h
        return found

    def slots(self) -> list[tuple[int, int | None, tuple[int, ...]]]:
        """(slot, hash, tokens) of every slot, by slot number; hash None for a free slot."""
        out: list[tuple[int, int | None, tuple[int, ...]]] = [(s, None, ()) for s in
                                                             range(self.num_blocks)]
        for h, (slot, tokens) in self.entries.items():
            out[slot] = (slot, h, tokens)
        return out

    def lru(self) -> tuple[int, ...]:
        """The held slots, the next to be overwritten first."""
        return tuple(slot for slot, _ in self.entries.values())

    def check(self) -> str | None:
        """What is inconsistent (slots used twice, lost or out of range), or None."""
        used = [slot for slot, _ in self.entries.values()]
        if len(set(used)) != len(used) or set(used) & set(self.free_slots):
            return "a tier slot is held twice"
        if len(used) + len(self.free_slots) != self.num_blocks:
            return f"tier slots: {len(used)} held + {len(self.free_slots)} free != {self.num_blocks}"
        return None
