"""Where the prefix tree's cells go (viz/prefix_tree_figure.py): a grid, one column per block of
a prompt, one row per branch. A node sits right of its parent, on its first child's row, each
further child on the rows after the first child's subtree (a file tree turned sideways).

Folding, so that a tree fits its box: when the tree is deeper than `max_cols`, each chain of
blocks without branches keeps its first and last block with one "… k blocks" cell between;
when the rows run out, the remaining siblings become one "+k more" cell. Orphans (blocks whose
parent was evicted) hang under a "(parent evicted)" cell. Ghosts (blocks the step evicted)
sit where they were, under their parent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from engine.describe.prefix_tree import PrefixTree, TreeNode

#: cell kinds, as viz/prefix_tree_figure.py colours them; EVENTS: a block a watched vLLM's KV
#: events name (engine/vllm/): in its cache, with no block id or ref count to say more
USED, SHARED, CACHED, TIER, FOLD, GHOST, EVENTS = range(7)


class Placed(NamedTuple):
    x: int
    y: int
    kind: int
    node: TreeNode | None  # None: a fold or a stand-in
    words: str = ""  # what a fold or stand-in says


class Layout(NamedTuple):
    cells: list[Placed]
    edges: list[tuple[tuple[int, int], tuple[int, int]]]  # (parent cell, child cell)


def kind_of(n: TreeNode) -> int:
    if n.block_id is None:
        return TIER if n.tier_slot is not None else EVENTS
    return SHARED if n.ref_count > 1 else USED if n.ref_count == 1 else CACHED


def place(tree: PrefixTree, ghosts: Sequence[TreeNode], max_rows: int, max_cols: int) -> Layout:
    kids: dict[int | None, list[tuple[TreeNode, int]]] = {}
    for n in tree.nodes:
        kids.setdefault(n.parent, []).append((n, kind_of(n)))
    for g in ghosts:
        kids.setdefault(g.parent, []).append((g, GHOST))
    for items in kids.values():
        items.sort(key=lambda item: item[0].token_ids)
    out = _Placer(kids, _depth(kids, None) > max_cols, max_rows)
    present = {n.block_hash for n in tree.nodes} | {g.block_hash for g in ghosts}
    out.siblings(kids.get(None, []), 0, None)
    for parent in sorted(p for p in kids if p is not None and p not in present):
        if out.row >= max_rows:
            break
        out.next_row()
        out.cells.append(Placed(0, out.row, FOLD, None, "(parent evicted)"))
        out.siblings(kids[parent], 1, (0, out.row))
    return Layout(out.cells, out.edges)


def _depth(kids: dict, h: int | None) -> int:
    return max((1 + _depth(kids, n.block_hash) for n, _ in kids.get(h, [])), default=0)


class _Placer:
    def __init__(self, kids: dict, fold_chains: bool, max_rows: int) -> None:
        self.kids, self.fold_chains, self.max_rows = kids, fold_chains, max_rows
        self.cells: list[Placed] = []
        self.edges: list = []
        self.row = -1  # no row used yet

    def next_row(self) -> None:
        self.row += 1

    def siblings(self, items: list, x: int, parent_xy: tuple[int, int] | None) -> None:
        """Children of one parent: the first on the parent's row (a new row at the top level)."""
        for i, item in enumerate(items):
            if i or parent_xy is None:
                self.next_row()
            if self.row >= self.max_rows - 1 and len(items) - i > 1:
                self.cells.append(Placed(x, self.row, FOLD, None, f"+{len(items) - i} more"))
                if parent_xy is not None:
                    self.edges.append((parent_xy, (x, self.row)))
                return
            self.put(item, x, parent_xy)

    def put(self, item: tuple[TreeNode, int], x: int, parent_xy: tuple[int, int] | None) -> None:
        chain = [item]
        while self.fold_chains and chain[-1][1] != GHOST:
            nxt = self.kids.get(chain[-1][0].block_hash, [])
            if len(nxt) != 1 or nxt[0][1] == GHOST:
                break
            chain.append(nxt[0])
        y = self.row
        if parent_xy is not None:
            self.edges.append((parent_xy, (x, y)))
        (first, k0), (last, k1) = chain[0], chain[-1]
        self.cells.append(Placed(x, y, k0, first))
        if len(chain) > 2:
            self.cells.append(Placed(x + 1, y, FOLD, None, f"… {len(chain) - 2} blocks"))
            self.edges += [((x, y), (x + 1, y)), ((x + 1, y), (x + 2, y))]
            x += 2
        elif len(chain) == 2:
            self.edges.append(((x, y), (x + 1, y)))
            x += 1
        if len(chain) > 1:
            self.cells.append(Placed(x, y, k1, last))
        if k1 != GHOST:
            self.siblings(self.kids.get(last.block_hash, []), x + 1, (x, y))
