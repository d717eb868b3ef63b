"""The prefix cache as a tree: every hashed full block (in the GPU pool, used or cached, and in
the CPU tier) is a node under the block whose hash its own hash chains from; the root's children
are the first blocks of prompts. Requests that share a system prompt share a trunk, and each
prompt's own blocks are a branch (SGLang's radix tree, here over vLLM's chained block hashes).

A block keeps its own hash and tokens, not its parent's hash, so the engine learns the chain as
it goes (`HashChain.note`: after every operation, the sequences that hashed or loaded a block
say which hash came before it). A hash the engine did not see being made is found by trying
the chain function on every hash present (`hash_block(parent, tokens) == hash`). The tree of a
snapshot is then a pure function of the snapshot and those facts, which never change (a hash's
parent is fixed by its tokens), so a snapshot recorded earlier draws the same tree later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, compress
from operator import attrgetter
from typing import Any, NamedTuple

from engine.core.events import Event
from engine.core.hashing import HashFn, hash_block

#: a parent never seen and not found among the hashes present: the node is an orphan
UNKNOWN_PARENT = -1
#: the most hashes remembered; past it the memory starts again (found by trial when needed)
MAX_REMEMBERED = 200_000
_UNSEEN = object()  # a hash the chain has no parent for yet
_KIND, _SEQ_ID = attrgetter("kind"), attrgetter("seq_id")
_LEARNED_FROM = frozenset(("cache", "load"))  # the events after which a chain grew


class TreeNode(NamedTuple):
    block_hash: int
    parent: int | None  # the hash it chains from (None: a prompt's first block; UNKNOWN_PARENT)
    depth: int | None  # its logical block in the prompt (0 = first), None where not known
    token_ids: tuple[int, ...]
    block_id: int | None  # its GPU pool block (None: only in the CPU tier)
    ref_count: int  # block-table entries pointing at it now (0: cached, evictable)
    lru: int | None  # its place in the pool's eviction order (0 = evicted next), None while used
    tier_slot: int | None  # its CPU tier slot, if the tier holds it
    tier_lru: int | None  # its place in the tier's order (0 = overwritten next)
    orphan: bool  # its parent is in neither the pool nor the tier (evicted)


@dataclass(frozen=True)
class PrefixTree:
    """The nodes of one KV cache group's prefix cache, parents before their children."""

    nodes: tuple[TreeNode, ...]
    group: str = "full"

    def children(self) -> dict[int | None, list[TreeNode]]:
        """Each node's children (key None: the root's; an orphan hangs under its parent's hash,
        which no node has)."""
        out: dict[int | None, list[TreeNode]] = {}
        for n in self.nodes:
            out.setdefault(n.parent, []).append(n)
        return out

    def by_block(self) -> dict[int, TreeNode]:
        """The node held in each GPU pool block."""
        return {n.block_id: n for n in self.nodes if n.block_id is not None}

    def edges(self) -> set[tuple[int | None, int]]:
        """(parent hash, child hash) of every node (None: the root)."""
        return {(n.parent, n.block_hash) for n in self.nodes}


class HashChain:
    """What the engine knows of the hash chain: the parent hash of every hash it saw made."""

    STATE = ("parent",)  # declared state (engine/core/state.py)
    FIXED = ("hash_fn",)

    def __init__(self, hash_fn: HashFn = hash_block) -> None:
        self.parent: dict[int, int | None] = {}
        self.hash_fn = hash_fn  # the engine's (EngineConfig.prefix_caching_hash_algo)

    def state(self) -> dict[int, int | None]:
        return dict(self.parent)  # ints only

    def load_state(self, state: dict[int, int | None]) -> None:
        self.parent = dict(state)

    def learn(self, hashes: Sequence[int]) -> None:
        """A sequence's chain of full-block hashes, in order (each after the one before it).
        This runs after every step that hashed or loaded a block: only the chain's end that is
        not known yet is added, found from the end back (a decode step that filled a block of a
        4,096-token sequence adds one hash, not 256: run 62 read 0.14-0.17 ms a step for
        re-adding whole chains, on an H100's host)."""
        parent = self.parent
        if len(parent) > MAX_REMEMBERED:
            parent.clear()
        start = len(hashes)
        while start and parent.get(hashes[start - 1], _UNSEEN) != (hashes[start - 2] if start > 1 else None):
            start -= 1
        new = hashes[start:]
        if new:  # n hashes, n + 1 parents
            parent.update(zip(new, chain((hashes[start - 1] if start else None,), new), strict=False))

    def note(self, events: Sequence[Event], seqs: Mapping[int, Any]) -> None:
        """After an operation: the chains of the sequences that hashed (`cache`) or loaded
        (`load`) a block in it."""
        # found at C speed: a long prompt's step makes thousands of events (a hybrid's twice)
        for sid in set(map(_SEQ_ID, compress(events, map(_LEARNED_FROM.__contains__,
                                                         map(_KIND, events))))):
            seq = seqs.get(sid)
            if seq is not None:
                self.learn(seq.block_hashes)

    def tree(self, snap: Any, group: str | None = None) -> PrefixTree:
        """The prefix cache of `snap` (an engine Snapshot) in `group` (the first KV cache group
        by default) as a tree."""
        group = group or (snap.kv_cache_groups[0].name if snap.kv_cache_groups else "full")
        lru = {b: i for i, b in enumerate(snap.cached_lru)}
        tier_lru = {s: i for i, s in enumerate(snap.tier_lru)}
        found: dict[int, dict[str, Any]] = {}
        for b in snap.blocks:
            if b.block_hash is not None and b.group == group:
                found[b.block_hash] = {"token_ids": b.token_ids, "block_id": b.block_id,
                                       "ref_count": b.ref_count, "lru": lru.get(b.block_id)}
        if group == (snap.kv_cache_groups[0].name if snap.kv_cache_groups else "full"):
            for t in snap.tier_blocks:  # the tier serves models of one group
                if t.block_hash is not None:
                    entry = found.setdefault(t.block_hash, {"token_ids": t.token_ids})
                    entry.update(tier_slot=t.block_id, tier_lru=tier_lru.get(t.block_id))
        parents = self._parents(found)
        depth: dict[int, int | None] = {}
        nodes = [TreeNode(h, parents[h], self._depth(h, depth), tuple(e["token_ids"]),
                          e.get("block_id"), e.get("ref_count", 0), e.get("lru"),
                          e.get("tier_slot"), e.get("tier_lru"),
                          parents[h] is not None and parents[h] not in found)
                 for h, e in found.items()]
        return PrefixTree(tuple(_parents_first(nodes)), group)

    def _parents(self, found: dict[int, dict[str, Any]]) -> dict[int, int | None]:
        """Each present hash's parent: remembered, or found by trying the chain function."""
        out: dict[int, int | None] = {}
        for h, e in found.items():
            if h in self.parent:
                out[h] = self.parent[h]
                continue
            tokens = e["token_ids"]
            guess = next((p for p in (None, *found) if p != h and self._chains(p, tokens, h)), h)
            if guess != h:  # found: remember it
                self.parent[h] = out[h] = guess
            else:  # its parent is gone and was never seen: an orphan of unknown depth
                out[h] = UNKNOWN_PARENT
        return out

    def _chains(self, parent: int | None, tokens: Any, h: int) -> bool:
        try:
            return self.hash_fn(parent, tokens) == h
        except TypeError:  # a vLLM chain needs a parent's digest, which a plain int lacks
            return False

    def _depth(self, h: int, memo: dict[int, int | None]) -> int | None:
        """How many blocks come before `h` in its prompt, by the remembered chain."""
        path: list[int] = []
        d: int | None = None
        while True:
            if h in memo:
                d = memo[h]
                break
            if h not in self.parent:
                break
            path.append(h)
            p = self.parent[h]
            if p is None:
                d = -1
                break
            h = p
        for node in reversed(path):
            d = None if d is None else d + 1
            memo[node] = d
        return memo.get(path[0]) if path else d


def _parents_first(nodes: list[TreeNode]) -> list[TreeNode]:
    """Breadth first from the root's children, siblings by their tokens; orphans' subtrees
    after (each under the parent that is gone)."""
    kids: dict[int | None, list[TreeNode]] = {}
    for n in nodes:
        kids.setdefault(n.parent, []).append(n)
    present = {n.block_hash for n in nodes}
    tops = [None] + sorted({n.parent for n in nodes if n.parent is not None
                            and n.parent not in present}, key=lambda p: (p == UNKNOWN_PARENT, p))
    out: list[TreeNode] = []
    for top in tops:
        level = sorted(kids.get(top, ()), key=lambda n: n.token_ids)
        while level:
            out += level
            level = [c for n in level for c in sorted(kids.get(n.block_hash, ()),
                                                       key=lambda c: c.token_ids)]
    return out
