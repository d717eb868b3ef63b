"""Where each physical block sits in the main picture (pure geometry, no plotly).

Token level (pools up to a few hundred blocks): a block is a strip of one label cell (its id)
and `block_size` slot cells, as in the paper's Fig. 6-9. The strips per row follow from the
picture's width so that a slot holds a ~6-character token whole, and runs of free blocks fold
into one row each ("blocks 9-63 free"): the pixels go to the blocks that hold data. Block level
(bigger pools, or a pool too tall even folded): one cell per block. The CPU swap space and the
prefix cache's CPU tier are bands of block-level cells under the pool. Coordinates are plot
units: x grows right, row r sits at y = y0 - r, one unit per row.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

TARGET_WIDTH = 44.0  # block level: plot units across
SLOT_PX = 46.0  # a slot that holds a 6-character token in 10 px type, with its margins
PLOT_PX = 850.0  # the picture's plot width on a laptop (1440 px wide page)
MAX_TOKEN_ROWS = 48  # taller than this and the token picture no longer fits a screen or two
FOLD_ROWS = 12  # a token picture taller than this folds its runs of free blocks
LABEL_W = 2.0  # the block-id cell of a token-level strip is two slots wide
GAP_W = 0.6  # between two strips of a row


@dataclass(frozen=True)
class PoolLayout:
    num_blocks: int
    block_size: int
    token_level: bool
    per_row: int  # blocks per row
    x0: float = 0.0
    y0: float = 0.0
    cell_w: float = 1.0  # width of one block-level cell
    # folded pictures: block id -> (row, column) of the blocks drawn, and the folded runs of
    # free blocks as (row, first id, last id); None: every block, in id order
    place: dict[int, tuple[int, int]] | None = field(default=None, compare=False)
    folds: tuple[tuple[int, int, int], ...] = ()
    num_rows: int | None = None
    label_w: float = LABEL_W  # token level: the block-id cell's width, in slots
    # a page that asks which block (every block must be clickable): a folded run is drawn as
    # rows of this many id cells, one per free block, instead of one labelled row (0: labelled)
    fold_cells: int = 0

    @property
    def rows(self) -> int:
        if self.num_rows is not None:
            return self.num_rows
        return -(-self.num_blocks // self.per_row) if self.num_blocks else 0

    def where(self, block_id: int) -> tuple[int, int] | None:
        """(row, column) of a drawn block; None for a block folded away."""
        if self.place is None:
            return divmod(block_id, self.per_row)
        return self.place.get(block_id)

    def fold_of(self, block_id: int) -> tuple[int, int, int] | None:
        return next((f for f in self.folds if f[1] <= block_id <= f[2]), None)

    @property
    def stride(self) -> float:
        if self.token_level:
            return self.label_w + self.block_size + GAP_W
        return self.cell_w

    @property
    def width(self) -> float:
        return self.per_row * self.stride - (GAP_W if self.token_level else 0.0)

    def box(self, block_id: int) -> tuple[float, float, float]:
        """(left, right, y centre) of a block's whole strip or cell (a folded block: its fold's
        row, the whole width)."""
        at = self.where(block_id)
        if at is None:
            fold = self.fold_of(block_id)
            r = fold[0] if fold else 0
            if fold and self.fold_cells:  # its own id cell in the fold's row
                cell = self.width / self.fold_cells
                left = self.x0 + (block_id - fold[1]) * cell
                return left, left + cell, self.y0 - r
            return self.x0, self.x0 + self.width, self.y0 - r
        r, c = at
        left = self.x0 + c * self.stride
        right = left + (self.label_w + self.block_size if self.token_level else self.cell_w)
        return left, right, self.y0 - r

    def anchor(self, block_id: int) -> tuple[float, float]:
        """Where a block-table link ends: the top middle of the block's id cell (or cell)."""
        left, right, y = self.box(block_id)
        x = left + self.label_w / 2 if self.token_level else (left + right) / 2
        return x, y + 0.45

    def x_edges(self) -> list[float]:
        """Heatmap column edges for one row (token level: label, slots, gap, ...)."""
        if not self.token_level:
            return [self.x0 + i * self.cell_w for i in range(self.per_row + 1)]
        edges = [self.x0]
        for c in range(self.per_row):
            left = self.x0 + c * self.stride
            if c:
                edges.append(left)  # end of the gap column before this strip
            edges.append(left + self.label_w)
            edges += [left + self.label_w + s + 1 for s in range(self.block_size)]
        return edges

    @property
    def columns_per_block(self) -> int:
        """Heatmap columns a block takes (token level: label + slots + the gap after it)."""
        return self.block_size + 2 if self.token_level else 1


def gpu_layout(num_blocks: int, block_size: int, force_block_level: bool = False,
               keep: Iterable[int] | None = None, plot_px: float = PLOT_PX,
               slot_px: float = SLOT_PX, label_w: float = LABEL_W,
               narrower: bool = True, fold: bool = True, id_folds: bool = False) -> PoolLayout:
    """The pool's layout for a picture `plot_px` wide. keep: the blocks that must be drawn (those
    holding data, those the step changed, the selected one); the others may fold. Slots as wide
    as `slot_px` where the picture stays within FOLD_ROWS rows (folded), else narrower ones
    (`narrower=False`: never narrower, and free runs fold only with `fold`: a picture sized to
    fit its box checks its height itself).
    `label_w`: the block-id cell's width in slots. `id_folds`: a folded run is rows of id cells,
    one per block (a page that asks which block: each can be clicked)."""
    strip = label_w + block_size + GAP_W
    widest = max(1, int(plot_px / slot_px / strip))  # slots that hold a 6-character token
    narrowest = max(widest, round(TARGET_WIDTH / strip))
    if not force_block_level and block_size <= 32:
        fallback = None
        if not narrower:
            per_row = min(widest, max(1, num_blocks))
            if not fold:
                return PoolLayout(num_blocks, block_size, True, per_row, label_w=label_w)
            return _token_layout(num_blocks, block_size, per_row, keep, label_w, always_fold=True,
                                 id_folds=id_folds)
        for per_row in range(min(widest, max(1, num_blocks)), narrowest + 1):
            layout = _token_layout(num_blocks, block_size, per_row, keep, label_w, id_folds=id_folds)
            if layout.rows <= FOLD_ROWS:
                return layout
            if fallback is None and layout.rows <= MAX_TOKEN_ROWS:
                fallback = layout
        if fallback is not None:
            return fallback
    width = 16 if num_blocks <= 256 else 32 if num_blocks <= 1024 else 64
    return PoolLayout(num_blocks, block_size, False, width, cell_w=TARGET_WIDTH / width)


def _token_layout(num_blocks: int, block_size: int, per_row: int,
                  keep: Iterable[int] | None, label_w: float = LABEL_W,
                  always_fold: bool = False, id_folds: bool = False) -> PoolLayout:
    plain = PoolLayout(num_blocks, block_size, True, per_row, label_w=label_w)
    if (plain.rows <= FOLD_ROWS and not always_fold) or keep is None:
        return plain
    folded = _fold(num_blocks, block_size, per_row, set(keep), label_w, id_folds)
    return folded if folded.rows < plain.rows else plain


def _fold(num_blocks: int, block_size: int, per_row: int, keep: set[int],
          label_w: float = LABEL_W, id_folds: bool = False) -> PoolLayout:
    """Blocks in id order, per_row to a row; a run of at least two rows' worth of blocks not
    kept becomes one row of its own, labelled by the picture (`id_folds`: rows of id cells, as
    many as a row's width in slots, so each folded block can still be clicked)."""
    place: dict[int, tuple[int, int]] = {}
    folds: list[tuple[int, int, int]] = []
    cells = max(1, int(per_row * (label_w + block_size + GAP_W) - GAP_W)) if id_folds else 0
    row, col, b = 0, 0, 0
    while b < num_blocks:
        run = b
        while run < num_blocks and run not in keep:
            run += 1
        if run - b >= 2 * per_row:
            if col:
                row, col = row + 1, 0
            for first in range(b, run, cells or run - b):  # one row, or rows of id cells
                folds.append((row, first, min(run, first + (cells or run - b)) - 1))
                row += 1
            b = run
            continue
        place[b] = (row, col)
        col += 1
        if col == per_row:
            row, col = row + 1, 0
        b += 1
    rows = row + (1 if col else 0)
    return PoolLayout(num_blocks, block_size, True, per_row, place=place, folds=tuple(folds),
                      num_rows=rows, label_w=label_w, fold_cells=cells)


def cpu_layout(num_blocks: int, block_size: int, below: PoolLayout) -> PoolLayout:
    """A CPU band: block-level cells under `below`, as wide as it (the swap space under the GPU
    pool; the prefix cache's tier, one cell per slot, under the swap space or the pool)."""
    per_row = max(1, min(num_blocks, 32))
    return PoolLayout(num_blocks, block_size, False, per_row, x0=0.0,
                      y0=below.y0 - below.rows - 1.2, cell_w=below.width / per_row)


def table_top(table_rows: int, waiting: bool) -> float:
    """The y of the first block-table row: the last sits 2 rows above the pool. With no table
    (and no waiting request's line, which sits over where the tables go) the picture starts at
    the pool's header, with no empty band above it."""
    return 1.0 + table_rows if table_rows or waiting else 0.0
