"""How big the main picture draws everything: its type sizes, slot and row sizes and the pool's
layout, as one `Sizes`.

Without a box (a test, an old caller) the picture keeps its fixed laptop sizes. Given the box
the page measured for it (`box=(width, height)` in CSS pixels; height 0: as tall as it needs),
the picture is fitted: the largest type, from a projector's 34 px down to a floor (14 px in
presenter mode, the smallest text a class reads), at which every drawn token is whole in its
slot, every block id in its label cell, every table cell shows its physical id, and the whole
picture is within the box's height. Widths come from viz/text_width.py, so the fit is decided
here and a browser test checks it on the drawn page.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from viz.pool_cells import block_label, slot_text
from viz.pool_layout import GAP_W, LABEL_W, PLOT_PX, SLOT_PX, PoolLayout, cpu_layout, gpu_layout, table_top
from viz.text_width import text_px

ROW_PX = 25  # laptop: pixels per row of the picture (21 for tall pools)
PRESENTER_PLOT_PX = 760.0  # the plot's width in presenter mode without a measured box
PRESENTER_TYPES = (34, 30, 26, 24, 22, 20, 18, 17, 16, 15, 14)  # token type sizes tried, largest first
LAPTOP_TYPES = (10,)  # the laptop look: the playground's 16-slot blocks in one row of ~850 px
PHONE_TYPES = (12, 11, 10)
PHONE_PX = 600  # a box narrower than this is a phone's


@dataclass(frozen=True)
class Sizes:
    """Everything the picture's builders size by. k scales titles, labels, notes and table text
    (12 px at 1); kt scales tokens (10 px at 1) and block ids (11 px at 1)."""

    k: float
    kt: float
    plot_px: float  # the plot area's width
    gpu: PoolLayout
    chars: int | None = None  # tokens longer than this are shortened ("…"); None: as wide as fits
    cells: tuple[float, float] | None = None  # the tables' narrowest cells (block_tables)
    row_px: float | None = None  # pixels per row; None: the laptop's ROW_PX
    height: int | None = None  # the figure's height; None: from its rows
    margin_l: float | None = None
    margin_t: float | None = None
    legend_chars: int | None = None  # visible characters a legend line holds
    legend_px: float | None = None  # the legend's type (None: 12k)
    fitted: bool = False  # sized for a measured box
    fixed_height: bool = False  # fitted to a box's height (else as tall as it needs)
    within: bool = True  # every text whole and the picture within the box (False: the best try)
    slot_text_px: float = 0.0  # fitted: the pixels a slot's text may take (0: not fitted)
    token_px: float = 10.0
    narrow: bool = False  # a phone's width: short titles

    @property
    def note_px(self) -> float:
        return 12 * self.k

    def fits(self, text: str) -> bool:
        """Whether `text` is whole in a slot of this fitted picture."""
        return text_px(_plain(text), self.token_px) <= self.slot_text_px


def laptop_sizes(num_blocks: int, block_size: int, block_level: bool, keep: Collection[int],
                 large: bool, id_folds: bool = False) -> Sizes:
    """The fixed sizes of a picture drawn without a measured box."""
    k, kt = (1.35, 1.8) if large else (1.0, 1.0)
    plot_px = PRESENTER_PLOT_PX if large else PLOT_PX
    gpu = gpu_layout(num_blocks, block_size, block_level, keep, plot_px, SLOT_PX * kt,
                     id_folds=id_folds)
    return Sizes(k, kt, plot_px, gpu)


@dataclass(frozen=True)
class Content:
    """What the picture will draw, as far as its size depends on it."""

    num_blocks: int
    block_size: int
    block_level: bool
    keep: Collection[int]
    slot_texts: Sequence[str]  # every drawn slot's text, unshortened (pending ones with "▸")
    block_labels: Sequence[str]  # every drawn block's id label ("7 ×2")
    row_labels: Sequence[str]  # the tables' row labels
    table_texts: tuple[Sequence[str], Sequence[str]]  # (narrow, wide) texts of table cells
    table_rows: int
    has_cpu: int = 0  # blocks of the swap space (0: none)
    has_tier: int = 0  # slots of the CPU tier (0: none)
    waiting: bool = False
    freed: bool = False
    legend_lines: Callable[[int], int] = lambda chars: 2  # lines of the legend at a line budget
    bands: int = 0  # labelled bands under the pool (viz/bands.py)
    title: str = ""  # the title's first line, as drawn (its tags take no room)
    id_folds: bool = False  # folded free runs drawn as id cells (a page that asks which block)


def fitted_sizes(content: Content, box: tuple[float, float], large: bool) -> Sizes:
    """The largest type at which the picture fits `box`; the floor's, tokens shortened, if none."""
    width, height = box
    width -= 10  # the column's padding, and a margin for the browser's own text widths
    narrow = width < PHONE_PX
    types = PRESENTER_TYPES if large else PHONE_TYPES if narrow else LAPTOP_TYPES
    floor = 14.0 if large else 10.0
    best = None
    # every block drawn (type of 18 px and up) where the box has room, else free runs fold; a box
    # with no height (a laptop, a phone) folds as before
    tries = [(t, True) for t in types]
    if height and not narrow:
        tries = [(t, False) for t in types if t >= 18] + tries + [(t, False) for t in types if t < 18]
    for t, fold in tries:
        sizes, needed, whole = _try(content, t, floor, width, narrow, fold)
        if whole and (not height or needed <= height):
            return _fill(sizes, needed, height)
        best = sizes
    if not content.block_level and height:  # too many blocks for their tokens in this box:
        return fitted_sizes(replace(content, block_level=True), box, large)  # one cell each
    return replace(best, within=False)


def _try(c: Content, t: float, floor: float, width: float, narrow: bool,
         fold: bool = True) -> tuple[Sizes, float, bool]:
    """Sizes at token type t px: (sizes, the height they need, whether every text is whole)."""
    kt = t / 10
    k = max(floor / 12, 0.85 * kt) if t > 10 else 1.0
    slot_px = max([text_px(s, t) for s in c.slot_texts] + [0.6 * t]) + 0.4 * t
    label_px = max([text_px(s, 11 * kt) for s in c.block_labels] + [t]) + 0.6 * t
    label_w = max(0.9, label_px / slot_px)
    margin_l = max([text_px(s, 12 * k) for s in c.row_labels] + [0]) + 12 * k
    plot_px = max(60.0, width - margin_l - 8)
    gpu = gpu_layout(c.num_blocks, c.block_size, c.block_level, c.keep, plot_px - 0.6 * slot_px,
                     slot_px, label_w, narrower=False, fold=fold, id_folds=c.id_folds)
    unit = plot_px / (gpu.width + 0.6)  # pixels per plot unit across
    whole = not gpu.token_level or (unit >= slot_px - 0.5 and gpu.label_w * unit >= label_px - 0.5)
    chars = None if whole else max(1, int(unit / (0.63 * t)))
    narrow_text, wide_text = c.table_texts
    cell_pad = 0.6 * 12 * k
    cells = (max([text_px(s, 12 * k) for s in narrow_text] + [1]) + cell_pad,
             max([text_px(s, 12 * k) for s in wide_text] + [1]) + cell_pad)
    cells_units = (cells[0] / unit, max(cells[0], cells[1]) / unit)
    if c.table_rows and cells_units[0] * 2 > gpu.width:  # not even two cells (one and "+N")
        whole = False
    legend_px = min(20.0, max(floor, 0.8 * 12 * k)) if t > 10 else 12.0
    if text_px(c.title, title_px(k), bold=True) > width - 16:  # the title's line must fit too
        whole = False
    legend_chars = int((width - 16) / (legend_px * 0.6))
    legend = c.legend_lines(legend_chars)
    row_px = max(1.35 * t + 2, 1.55 * 12 * k, (1.25 * 12 * k + 4) if c.table_rows else 0)
    if not gpu.token_level:  # one cell per block: its ref count in type that fits the row
        row_px = max(20.0, 1.55 * 12 * k, (1.25 * 12 * k + 4) if c.table_rows else 0)
    span = _span(c, gpu)
    # the key's lines are <br>s of the title, whose own type is the key's (pool_figure._frame):
    # plotly spaces each at 1.3x that type
    margin_t = title_px(k) * 1.45 + legend * legend_px * LINE_SPACING + 12 * k
    needed = margin_t + span * row_px + 8
    sizes = Sizes(k, kt, plot_px, gpu, chars=chars, cells=cells_units, row_px=row_px,
                  height=int(needed), margin_l=margin_l, margin_t=margin_t,
                  legend_chars=legend_chars, legend_px=legend_px, fitted=True, narrow=narrow,
                  slot_text_px=unit - 0.4 * t, token_px=t)
    return sizes, needed, whole


LINE_SPACING = 1.3  # plotly's svg_text_utils: a <br>'s line, in the text's font size


def title_px(k: float) -> float:
    """The title's type: 16 px at k = 1, at most 30 (a projector's title, not a headline)."""
    return min(30.0, 16 * k)


def _fill(sizes: Sizes, needed: float, height: float) -> Sizes:
    """A box taller than the picture needs: rows grow (up to 1.4x) and the rest stays blank
    under the picture, which keeps the box's height."""
    if not height:
        return sizes
    span = (needed - 8 - sizes.margin_t) / sizes.row_px
    row_px = min(sizes.row_px * 1.4, (height - 8 - sizes.margin_t) / span)
    return replace(sizes, row_px=max(sizes.row_px, row_px), height=int(height), fixed_height=True)


def _span(c: Content, gpu: PoolLayout) -> float:
    """The picture's height in rows: what pool_figure lays out (tables above the pool, headers,
    the pool's rows and folds, the freed label, the CPU bands, the waiting line)."""
    top = table_top(c.table_rows, c.waiting)
    bottom = -gpu.rows + 0.4 - (0.85 if c.freed else 0.0)
    below = gpu
    for n in (c.has_cpu, c.has_tier):
        if n:
            band = cpu_layout(n, c.block_size, below)
            bottom = band.y0 - band.rows + 0.4
            below = band
    top += 1.0 if c.waiting else 0.0
    bottom -= 2.0 * c.bands  # each: its label and its row (viz/bands.py)
    return top + 1.6 - bottom


def content_of(blocks: Sequence, gpu_keep: Collection[int], pending: dict[int, tuple[int, str]],
               token_text: Callable[[int], str], num_blocks: int, block_size: int) -> tuple[list, list]:
    """(slot texts, block labels) of the blocks a picture may draw: every block kept (the
    others may fold away; a free block's label is its id alone)."""
    slots: list[str] = []
    labels: list[str] = []
    for blk in blocks:
        if blk.block_id not in gpu_keep:
            continue
        labels.append(block_label(blk) + "ˢ")  # room for a hybrid's mark
        slots += [_plain(slot_text(token_text(t), 10 ** 6)) for t in blk.token_ids]
    # a pending token (sampled, in no slot yet) is drawn in its slot only if it is whole there
    slots += ["▸"] * bool(pending)
    labels.append(str(max(0, num_blocks - 1)))  # a free block's label (any id)
    return slots, labels


def _plain(text: str) -> str:
    """What an escaped slot text shows ("&amp;" is one character wide)."""
    return text.replace("&lt;", "<").replace("&amp;", "&")


MAX_ROWS = 10  # a fitted picture draws at most this many table rows (the rest are counted)


__all__ = ["MAX_ROWS", "GAP_W", "LABEL_W", "ROW_PX", "Content", "Sizes", "content_of", "fitted_sizes",
           "laptop_sizes"]
