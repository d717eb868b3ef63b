"""Where each physical block sits in the main picture (pure geometry, no plotly).

Token level (pools up to a few hundred blocks): a block is a strip of one label cell (its id)
and `block_size` slot cells, a few strips per row, as in the paper's Fig. 6-9. Block level
(bigger pools): one cell per block. Coordinates are plot units: x grows right, row r sits at
y = y0 - r, one unit per row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TARGET_WIDTH = 44.0  # plot units across (about one slot per 20 px on a 900 px picture)
MIN_WIDTH = 20.0
MAX_TOKEN_ROWS = 48  # taller than this and the token picture no longer fits a screen or two
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

    @property
    def rows(self) -> int:
        return -(-self.num_blocks // self.per_row) if self.num_blocks else 0

    @property
    def stride(self) -> float:
        if self.token_level:
            return LABEL_W + self.block_size + GAP_W
        return self.cell_w

    @property
    def width(self) -> float:
        return self.per_row * self.stride - (GAP_W if self.token_level else 0.0)

    def box(self, block_id: int) -> tuple[float, float, float]:
        """(left, right, y centre) of a block's whole strip or cell."""
        r, c = divmod(block_id, self.per_row)
        left = self.x0 + c * self.stride
        right = left + (LABEL_W + self.block_size if self.token_level else self.cell_w)
        return left, right, self.y0 - r

    def anchor(self, block_id: int) -> tuple[float, float]:
        """Where a block-table link ends: the top middle of the block's id cell (or cell)."""
        left, right, y = self.box(block_id)
        x = left + LABEL_W / 2 if self.token_level else (left + right) / 2
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
            edges.append(left + LABEL_W)
            edges += [left + LABEL_W + s + 1 for s in range(self.block_size)]
        return edges

    @property
    def columns_per_block(self) -> int:
        """Heatmap columns a block takes (token level: label + slots + the gap after it)."""
        return self.block_size + 2 if self.token_level else 1


def gpu_layout(num_blocks: int, block_size: int, force_block_level: bool = False) -> PoolLayout:
    strip = LABEL_W + block_size + GAP_W
    most = max(1, round(TARGET_WIDTH / strip))  # the narrowest slots that still hold text
    # a small pool gets wider slots (longer token text): as few strips per row as keep it
    # within ~16 rows, but never fewer than fill MIN_WIDTH units (a very wide slot reads oddly)
    per_row = min(most, max(math.ceil(num_blocks / 16), math.ceil(MIN_WIDTH / strip), 1))
    rows = math.ceil(num_blocks / per_row)
    if not force_block_level and block_size <= 32 and rows <= MAX_TOKEN_ROWS:
        return PoolLayout(num_blocks, block_size, True, per_row)
    width = 16 if num_blocks <= 256 else 32 if num_blocks <= 1024 else 64
    return PoolLayout(num_blocks, block_size, False, width, cell_w=TARGET_WIDTH / width)


def cpu_layout(num_blocks: int, block_size: int, below: PoolLayout) -> PoolLayout:
    """The CPU swap space: block-level cells in a band under the GPU pool, as wide as it."""
    per_row = max(1, min(num_blocks, 32))
    return PoolLayout(num_blocks, block_size, False, per_row, x0=0.0,
                      y0=below.y0 - below.rows - 1.2, cell_w=below.width / per_row)
