"""The physical pool as ONE plotly Heatmap: every block's slots with their token text (token
level) or one cell per block (block level). Colour = owner, shared, cached or free; empty slots
white; the slot the pending token will take is marked. customdata[0] of every cell is the block
id, which the page's click handler reads. The prefix cache's CPU tier is one more Heatmap of
block-level cells, one per slot."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

import plotly.graph_objects as go

from engine.describe.snapshot import BlockView
from viz import palette
from viz.pool_layout import PoolLayout
from viz.text_width import text_px

FAST = {"_validate": False}  # traces built here are fixed in code; tests validate the JSON
MAX_TEXT_BLOCKS = 512  # block level: ref counts printed in cells up to this pool size

# categories of the discrete colour scale (DROPPED last: the owners' categories keep their numbers)
FREE, CACHED, SHARED, PENDING, OWNER0 = 0, 1, 2, 3, 4
COLOURS = [palette.FREE, palette.CACHED, palette.SHARED, palette.PENDING, *palette.OWNERS,
           palette.DROPPED]
DROPPED = len(COLOURS) - 1  # a block-table entry that a sliding window dropped


def colourscale() -> list[list]:
    n = len(COLOURS)
    scale = []
    for i, c in enumerate(COLOURS):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale


def category(block: BlockView) -> int:
    if block.ref_count > 1:
        return SHARED
    if block.ref_count == 1:
        return OWNER0 + block.owners[0] % len(palette.OWNERS)
    return CACHED if block.state == "cached" else FREE


def owner_category(seq_id: int) -> int:
    return OWNER0 + seq_id % len(palette.OWNERS)


def escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace("\n", "⏎")


def shorten(s: str, n: int) -> str:
    return s if len(s) <= n else s[: max(1, n - 1)] + "…"


def slot_text(token: str, chars: int) -> str:
    """A token as it fits a slot: a leading space becomes '·' only when nothing else shows."""
    t = token.replace("\n", "⏎").strip(" ") or "␣"
    return escape(shorten(t, chars))


def block_hover(blk: BlockView, block_size: int, prefix: str = "",
                groups: Mapping[str, str] | None = None) -> str:
    """A block's hover text, short: every big pool sends one per block. `groups`: group name ->
    its words, for a model with a sliding window (which layers a block's page serves)."""
    owners = ",".join(map(str, blk.owners)) or "-"
    digest = "" if blk.block_hash is None else f" · hash {blk.block_hash & 0xFFFFFFFF:08x}"
    served = ""
    if groups and blk.state != "free" and blk.group in groups:  # a free page serves no layers
        served = f"<br>group: {groups[blk.group]}"
    return (f"block {prefix}{blk.block_id} · {blk.state} · ref {blk.ref_count} · seq {owners} · "
            f"{blk.num_filled}/{block_size}{digest}{served}")


def pool_heatmap(blocks: Sequence[BlockView], layout: PoolLayout, token_text: Callable[[int], str],
                 pending: Mapping[int, tuple[int, str]], name: str, prefix: str = "",
                 scale: float = 1.0, plot_px: float = 850.0, blank: Collection[int] = (),
                 groups: Mapping[str, str] | None = None, chars: int | None = None,
                 fits: Callable[[str], bool] | None = None) -> go.Heatmap:
    """pending: block id -> (slot, token text) of a pending token whose next slot is there;
    scale: type size (presenter mode); blank: blocks drawn without their tokens (a reserve);
    groups: the KV cache groups' words for the hover (block_hover); chars: the longest token
    text a slot shows whole (None: what a slot of this picture's width holds in 10 px type);
    fits: whether a pending token's "▸token" is whole in its slot (else the slot shows "▸" and
    the table's last cell names the token)."""
    cols = len(layout.x_edges()) - 1
    z: list[list] = [[None] * cols for _ in range(layout.rows)]
    text = [[""] * cols for _ in range(layout.rows)]
    custom: list[list] = [[None] * cols for _ in range(layout.rows)]
    per_col = layout.columns_per_block
    if chars is None:
        chars = max(1, int(plot_px / max(layout.width, 1.0) / (6.3 * scale)))  # 10 px type x scale
    show_refs = len(blocks) <= MAX_TEXT_BLOCKS
    for blk in blocks:
        at = layout.where(blk.block_id)
        if at is None:  # folded into a "blocks i-j free" row
            continue
        r, c = at
        cat = category(blk)
        if blk.block_id in blank:  # held back, not data: an empty strip under the hatching
            blk = blk._replace(token_ids=(), ref_count=0, owners=())
            cat = FREE
        about = block_hover(blk, layout.block_size, prefix, groups)
        col0 = c * per_col
        z[r][col0] = cat
        if not layout.token_level:
            text[r][col0] = str(blk.ref_count) if show_refs and blk.ref_count else ""
            tokens = "".join(token_text(t) for t in blk.token_ids)
            custom[r][col0] = [blk.block_id, about + (f"<br>tokens: {escape(shorten(tokens, 60))}"
                                                      if tokens else "")]
            continue
        custom[r][col0] = [blk.block_id, about]  # its id is drawn by block_ids(), above the cell
        pend = pending.get(blk.block_id)
        for s in range(layout.block_size):
            col = col0 + 1 + s
            if s < len(blk.token_ids):
                tok = token_text(blk.token_ids[s])
                z[r][col] = cat
                text[r][col] = slot_text(tok, chars) if chars else ""
                custom[r][col] = [blk.block_id, f"block {blk.block_id}, slot {s}: {escape(repr(tok))}"]
            elif pend is not None and pend[0] == s:
                z[r][col] = PENDING
                whole = "▸" + slot_text(pend[1], 10 ** 6)
                short = "▸" + slot_text(pend[1], max(1, chars - 1)) if chars else "▸"
                text[r][col] = (whole if fits(whole) else "▸") if fits else short
                custom[r][col] = [blk.block_id, f"block {blk.block_id}, slot {s}: next, the pending "
                                                f"token {escape(repr(pend[1]))} (sampled, not yet written)"]
            else:
                z[r][col] = FREE
                custom[r][col] = [blk.block_id, f"block {blk.block_id}, slot {s}: empty"]
    return go.Heatmap(**FAST,
        z=z, x=layout.x_edges(), y=[layout.y0 - r for r in range(layout.rows)], text=text,
        texttemplate="%{text}", textfont={"size": (10 if layout.token_level else 11) * scale},
        customdata=custom, zmin=-0.5,
        zmax=len(COLOURS) - 0.5, colorscale=colourscale(), showscale=False, xgap=1, ygap=4,
        name=name, hovertemplate="%{customdata[1]}<extra></extra>", hoverongaps=False)


def fold_id_cells(layout: PoolLayout, block_size: int, scale: float = 1.0) -> list[go.Heatmap]:
    """Folded runs of free blocks as rows of id cells, one per block (a page that asks which
    block: each can be clicked, as "free blocks", with its id in customdata[0]); none where the
    folds are labelled rows."""
    if not layout.fold_cells or not layout.folds:
        return []
    n = layout.fold_cells
    z: list[list] = [[None] * n for _ in range(layout.rows)]
    text = [[""] * n for _ in range(layout.rows)]
    custom: list[list] = [[None] * n for _ in range(layout.rows)]
    for row, first, last in layout.folds:
        for b in range(first, last + 1):
            z[row][b - first] = FREE
            text[row][b - first] = str(b)
            custom[row][b - first] = [b, f"block {b} · free · 0/{block_size}"]
    cell = layout.width / n
    return [go.Heatmap(**FAST,
        z=z, x=[layout.x0 + i * cell for i in range(n + 1)], y=[layout.y0 - r for r in range(layout.rows)],
        text=text, texttemplate="%{text}", textfont={"size": 11 * scale, "color": palette.MUTED},
        customdata=custom, zmin=-0.5, zmax=len(COLOURS) - 0.5, colorscale=colourscale(),
        showscale=False, xgap=3, ygap=4, name="free blocks",
        hovertemplate="%{customdata[1]}<extra></extra>", hoverongaps=False)]


def block_label(blk: BlockView, prefix: str = "", mark: str = "") -> str:
    return f"{prefix}{blk.block_id}{mark}" + (f" ×{blk.ref_count}" if blk.ref_count > 1 else "")


def block_ids(blocks: Sequence[BlockView], layout: PoolLayout, scale: float = 1.0,
              blank: Collection[int] = (), marks: Mapping[str, str] | None = None,
              cell_px: float | None = None) -> go.Scatter | None:
    """Each drawn block's id (and ref count when shared) in its label cell, as text of its own
    trace: 11 px on a laptop, 18 on a projector, and still drawn on a phone, where the slots'
    token text (10 px) is hidden for being wider than the slots. `marks`: group name -> a mark
    after the id of a block holding that group's K/V (a hybrid model's "ˢ" for sliding).
    `cell_px`: the label cell's width in pixels (a fitted picture): an id and ref count wider
    than it show the id alone (a phone's "0 ×4" was clipped to "×4"; the hover says ×4)."""
    if not layout.token_level:
        return None

    def fits(label: str) -> bool:
        return cell_px is None or text_px(label, 11 * scale) <= cell_px - 2
    xs, ys, texts, colours = [], [], [], []
    for blk in blocks:
        at = layout.where(blk.block_id)
        if at is None:
            continue
        left, _, y = layout.box(blk.block_id)
        xs.append(left + layout.label_w / 2)  # the middle of the label cell
        ys.append(y)
        mark = (marks or {}).get(blk.group, "") if blk.state != "free" else ""  # a free page serves none
        label = block_label(blk._replace(ref_count=0) if blk.block_id in blank else blk, mark=mark)
        texts.append(label if fits(label) else block_label(blk._replace(ref_count=0), mark=mark))
        fill = palette.FREE if blk.block_id in blank else COLOURS[category(blk)]
        colours.append(palette.text_on(fill))  # readable on the block's own colour
    return go.Scatter(**FAST, x=xs, y=ys, mode="text", text=texts, name="block ids",
                      textfont={"size": 11 * scale, "color": colours}, hoverinfo="skip",
                      showlegend=False)


def tier_heatmap(slots: Sequence[BlockView], lru: Sequence[int], layout: PoolLayout,
                 token_text: Callable[[int], str], scale: float = 1.0,
                 cell_px: float | None = None) -> go.Heatmap:
    """The prefix cache's CPU tier: one cell per slot ("t3"), grey where it keeps an evicted
    block (hover: its hash, tokens and place in the LRU order), white where free. `cell_px`: a
    cell's width on the screen, where the picture is fitted; the labels' type fits it."""
    size = 11 * scale
    if cell_px and slots:  # the type grows with the picture's rows, a cell's width does not
        size = min(size, (cell_px - 8) / text_px(f"t{max(b.block_id for b in slots)}", 1.0))
    z: list[list] = [[None] * layout.per_row for _ in range(layout.rows)]
    text = [[""] * layout.per_row for _ in range(layout.rows)]
    custom: list[list] = [[None] * layout.per_row for _ in range(layout.rows)]
    order = {slot: i for i, slot in enumerate(lru)}
    for blk in slots:
        r, c = divmod(blk.block_id, layout.per_row)
        text[r][c] = f"t{blk.block_id}"
        if blk.state != "cached":
            z[r][c] = FREE
            custom[r][c] = [blk.block_id, f"tier slot {blk.block_id} · free"]
            continue
        z[r][c] = CACHED
        tokens = escape(shorten("".join(token_text(t) for t in blk.token_ids), 60))
        nth = order.get(blk.block_id)
        lru_words = "" if nth is None else (" · overwritten next" if nth == 0 else
                                            f" · overwritten after {nth} more")
        digest = "" if blk.block_hash is None else f" · hash {blk.block_hash & 0xFFFFFFFF:08x}"
        custom[r][c] = [blk.block_id, f"tier slot {blk.block_id} · an evicted block's K/V{digest}"
                                      f"{lru_words}<br>tokens: {tokens}"]
    return go.Heatmap(**FAST,
        z=z, x=layout.x_edges(), y=[layout.y0 - r for r in range(layout.rows)], text=text,
        texttemplate="%{text}", textfont={"size": size}, customdata=custom, zmin=-0.5,
        zmax=len(COLOURS) - 0.5, colorscale=colourscale(), showscale=False, xgap=1, ygap=4,
        name="cpu tier", hovertemplate="%{customdata[1]}<extra></extra>", hoverongaps=False)
