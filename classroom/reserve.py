"""The teacher's Shrink pool: blocks a room takes away from its class.

The room holds them in sequences of its own, labelled "reserved" in the picture, so running
requests get preempted as they would on a smaller GPU. The reserve tops itself up after every
step, as requests free blocks, until it holds its target; Whole pool gives them all back.
"""

from __future__ import annotations

import dataclasses

from engine import LLMEngine, ops
from engine.describe.prefix_tree import PrefixTree


class Reserve:
    def __init__(self) -> None:
        self.target = 0  # blocks the teacher took away from the class
        self.seqs: list[int] = []  # the engine's sequences holding them
        self._count = 0  # sequences made so far (each starts with its own token)
        self._hashes: set[int] = set()  # hashes of the filler blocks, held or cached since

    def blocks(self, eng: LLMEngine) -> int:
        """Blocks the reserve holds now."""
        return sum(len(eng.block_table(s)) for s in self.seqs)

    def block_ids(self, eng: LLMEngine) -> frozenset[int]:
        return frozenset(b for s in self.seqs for b in eng.block_table(s))

    def usable(self, eng: LLMEngine) -> int:
        """Blocks the class may use (the pool less the target)."""
        return eng.pool_size() - self.target

    def top_up(self, eng: LLMEngine) -> None:
        """Take free blocks until the reserve holds its target: one sequence of filler tokens
        per take, each starting with its own token so no two share a prefix-cache block."""
        bs = eng.config.block_size
        want = min(self.target - self.blocks(eng), eng.num_allocatable_blocks(), eng.max_model_len // bs)
        if want <= 0:
            return
        self._count += 1
        first = (7919 * self._count) % eng.vocab_size
        self.seqs.append(eng.apply(ops.AddSequence([first] * (want * bs))))

    def release(self, eng: LLMEngine) -> None:
        """Free every block the reserve holds (its target stays)."""
        for seq in self.seqs:
            eng.apply(ops.Free(seq))
        self.seqs = []

    def forget(self) -> None:
        """A fresh engine (the room was cleared): nothing held, nothing to take."""
        self.target, self.seqs, self._hashes = 0, [], set()

    def hidden_from(self, tree: PrefixTree, eng: LLMEngine) -> PrefixTree:
        """The class's prefix cache: the tree without the reserve's filler blocks (held now, or
        cached after Whole pool gave them back), which no prompt of the class can hit."""
        held = self.block_ids(eng)
        self._hashes.update(n.block_hash for n in tree.nodes if n.block_id in held)
        kept = tuple(n for n in tree.nodes if n.block_hash not in self._hashes)
        return dataclasses.replace(tree, nodes=kept)
