"""What a watched vLLM's prefix cache holds, folded from its KV events; its tree, counts and
timeline.

A "stored" event adds blocks (hash, parent hash, tokens), a "removed" one takes them away, a
"cleared" one empties the cache. vLLM does not deduplicate: two physical blocks of the same
content (say the n samples of one request, each filling its own copy of a block) are stored
twice under one hash, and evicted one at a time, so the mirror counts copies per hash and a
hash leaves the tree when its last copy is removed.

The tree is the type `LLMEngine.prefix_tree()` returns (engine/describe/prefix_tree.py), with the
fields events cannot fill left empty: `block_id` None (events name no physical block), ref
count 0 and no LRU place (events carry neither), no CPU tier slot. Blocks stored with
`medium` other than the GPU's (vLLM's offloading tiers) are counted, not drawn in the tree.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from engine.describe.prefix_tree import MAX_REMEMBERED, HashChain, PrefixTree, TreeNode, _parents_first
from engine.vllm.schema import VllmEvent

#: the most batches the timeline keeps
MAX_TIMELINE = 100_000
_GPU = (None, "GPU", "gpu")


@dataclass(frozen=True, slots=True)
class BatchMark:
    """One message of the timeline: what its events did."""

    seq: int
    ts: float
    stored: int  # blocks stored
    removed: int  # blocks removed
    cleared: bool  # the cache was reset in it


@dataclass(frozen=True)
class WatchCounts:
    """The running totals a watch view prints."""

    blocks: int  # distinct hashes in vLLM's GPU prefix cache now
    copies: int  # physical blocks holding them (a hash stored twice counts twice)
    stored: int  # blocks stored since the watch began
    removed: int  # blocks removed since the watch began
    cleared: int  # resets of the whole cache
    other_medium: int  # blocks in vLLM's offloading tiers now (not in the tree)
    unknown_removed: int  # removals of hashes the watch never saw stored (it joined late)
    batches: int  # messages applied
    events: int  # events applied


class CacheMirror:
    """The prefix cache of one vLLM as its events tell it."""

    def __init__(self) -> None:
        self.nodes: dict[tuple[int, int], tuple[int | None, tuple[int, ...]]] = {}  # (group, hash)
        self.copies: dict[tuple[int, int], int] = {}
        self.other: dict[tuple[str, int, int], int] = {}  # (medium, group, hash) -> copies
        self.chain = HashChain()  # every hash seen: its parent (for depths)
        self.timeline: deque[BatchMark] = deque(maxlen=MAX_TIMELINE)
        self.stored = self.removed = self.cleared = self.unknown_removed = 0
        self.batches = self.events = 0

    def apply(self, events: Iterable[VllmEvent]) -> None:
        """Fold one message's events (all of the same `seq`) into the cache."""
        stored = removed = 0
        cleared = False
        seq, ts = -1, 0.0
        for e in events:
            seq, ts = e.seq, e.ts
            self.events += 1
            if e.kind == "stored":
                stored += self._store(e)
            elif e.kind == "removed":
                removed += self._remove(e)
            else:
                self.nodes.clear()
                self.copies.clear()
                self.other.clear()
                self.cleared += 1
                cleared = True
        if seq >= 0:
            self.batches += 1
            self.timeline.append(BatchMark(seq, ts, stored, removed, cleared))

    def _store(self, e: VllmEvent) -> int:
        known = self.chain.parent
        if len(known) > MAX_REMEMBERED:
            known.clear()
        blocks = e.blocks()
        for h, parent, tokens in blocks:
            known[h] = parent
            if e.medium in _GPU:
                key = (e.group, h)
                self.nodes[key] = (parent, tokens)
                self.copies[key] = self.copies.get(key, 0) + 1
            else:
                okey = (e.medium, e.group, h)
                self.other[okey] = self.other.get(okey, 0) + 1
        self.stored += len(blocks)
        return len(blocks)

    def _remove(self, e: VllmEvent) -> int:
        for h in e.block_hashes:
            if e.medium in _GPU:
                key, held = (e.group, h), self.copies
            else:
                key, held = (e.medium, e.group, h), self.other
            left = held.get(key, 0) - 1
            if left < 0:
                self.unknown_removed += 1
            elif left == 0:
                del held[key]
                if held is self.copies:
                    del self.nodes[key]
            else:
                held[key] = left
        self.removed += len(e.block_hashes)
        return len(e.block_hashes)

    def counts(self) -> WatchCounts:
        return WatchCounts(len(self.nodes), sum(self.copies.values()), self.stored, self.removed,
                           self.cleared, sum(self.other.values()), self.unknown_removed,
                           self.batches, self.events)

    def hashes(self, group: int = 0) -> set[int]:
        """The hashes vLLM's GPU prefix cache holds now in KV cache group `group`."""
        return {h for g, h in self.nodes if g == group}

    def tree(self, group: int = 0) -> PrefixTree:
        """vLLM's GPU prefix cache in KV cache group `group` as a tree, parents before children
        (siblings by their tokens). What events cannot say is left empty: block_id None,
        ref_count 0, lru None, no tier slot."""
        mine = {h: v for (g, h), v in self.nodes.items() if g == group}
        memo: dict[int, int | None] = {}
        depth = self.chain._depth  # the engine's own walk up the remembered chain
        nodes = [TreeNode(h, parent, depth(h, memo), tokens, None, 0, None, None, None,
                          parent is not None and parent not in mine)
                 for h, (parent, tokens) in mine.items()]
        return PrefixTree(tuple(_parents_first(nodes)), "full" if group == 0 else f"group {group}")
