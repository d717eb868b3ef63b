"""What the last step changed, and what is selected, drawn over the pool.

Every change is a persistent mark plus, where it moves, an invisible twin that the page animates
(ui/motion.js via the trace's name): a new block's white "cover" fades out so the block fades
in; a prefix hit's gold "flash" blinks; an evicted block's grey "ghost" fades out; a swap's
dots slide from the GPU block to its CPU copy, and so do an offload's (GPU block -> CPU tier
slot) and a load's (tier slot -> GPU block), in the one "swap slide" trace the page animates;
the copy-on-write arrow draws itself from source to copy. The twins have opacity 0 in the
figure, so a static image (or reduce-motion) shows the end state and nothing else. A block the
step gave back (a freed sequence, a rejected draft, a sliding window's drop) gets a dotted
outline when no table holds it any more.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import plotly.graph_objects as go

from engine.core.events import Event
from viz import palette
from viz.pool_cells import FAST
from viz.pool_layout import PoolLayout

HALF_H = 0.47  # half the height of a drawn row around a block
FREED_GAP = 0.15  # rows between the pool's last row and the freed blocks' label under it


def rects(layout: PoolLayout, ids: Iterable[int], name: str, colour: str, width: float = 3.0,
          fill: str | None = None, opacity: float = 1.0, pad: float = 0.08) -> list[go.Scatter]:
    """Rectangles around blocks' strips (one None-separated trace; filled if `fill`)."""
    xs: list = []
    ys: list = []
    for b in dict.fromkeys(ids):  # each block once, in order
        if not 0 <= b < layout.num_blocks:
            continue
        left, right, y = layout.box(b)
        left, right, lo, hi = left - pad, right + pad, y - HALF_H, y + HALF_H
        xs += [left, right, right, left, left, None]
        ys += [lo, lo, hi, hi, lo, None]
    if not xs:
        return []
    style: dict = {"line": {"color": colour, "width": width}}
    if fill:
        style = {"fill": "toself", "fillcolor": fill, "line": {"color": fill, "width": 0}}
    return [go.Scatter(**FAST, x=xs, y=ys, mode="lines", name=name, opacity=opacity,
                       hoverinfo="skip", showlegend=False, **style)]


def change_overlays(events: Sequence[Event], gpu: PoolLayout, cpu: PoolLayout | None,
                    in_use: Iterable[int] | None = None, tier: PoolLayout | None = None,
                    label_px: float = 11) -> list:
    """The marks of the last step's changes. With `in_use` (the blocks some table holds now),
    a change to a block that the same step freed again (a finished request, a dropped beam)
    draws no arrow or outline into it: the block is outlined once as "freed" instead. `tier`:
    the CPU tier's band, where offloads and loads end and start. `label_px`: the type of the
    freed blocks' label."""
    new, hits, evicted, cow_pairs, swaps, freed = [], [], [], [], [], []
    moves: list[tuple[int, int, bool]] = []  # (GPU block, tier slot, offload?)
    windowed: set[int] = set()  # blocks a sliding window dropped
    for e in events:
        if e.kind == "allocate":
            new += e.block_ids
        elif e.kind == "prefix_hit":
            hits += e.block_ids
        elif e.kind == "evict":
            evicted += e.block_ids
        elif e.kind == "cow":
            cow_pairs.append(e.block_ids)
            new.append(e.block_ids[1])
        elif e.kind in ("swap_out", "swap_in") and cpu is not None:
            ids = e.block_ids
            for a, b in zip(ids[::2], ids[1::2], strict=True):
                gpu_id, cpu_id = (a, b) if e.kind == "swap_out" else (b, a)
                swaps.append((gpu_id, cpu_id, e.kind == "swap_out"))
        elif e.kind in ("free", "reject", "drop"):  # a reject's blocks held only rejected drafts
            freed += e.block_ids
            windowed.update(e.block_ids if e.kind == "drop" else ())
        elif e.kind == "offload" and e.block_ids and e.facts:
            moves.append((e.block_ids[0], e.facts.slot, True))
        elif e.kind == "load" and e.facts:
            moves += [(b, slot, False) for b, slot in zip(e.block_ids, e.facts.slots, strict=False)]
    if in_use is not None:
        held = set(in_use)
        freed = [b for b in freed if b not in held]
        new = [b for b in new if b in held]
        hits = [b for b in hits if b in held]
        cow_pairs = [p for p in cow_pairs if p[1] in held]
    else:
        freed = []
    new = [b for b in new if b not in set(evicted)]  # an evicted-and-reused block fades by itself
    out = rects(gpu, evicted, "evicted ghost", palette.CACHED, fill=palette.CACHED, opacity=0.0, pad=0)
    out += rects(gpu, new, "new block cover", palette.FREE, fill=palette.FREE, opacity=0.0, pad=0)
    out += rects(gpu, hits, "prefix hit flash", palette.SHARED, fill=palette.SHARED, opacity=0.0)
    out += rects(gpu, new, "new block", palette.NEW, 3)
    out += rects(gpu, hits, "prefix hit", palette.PREFIX_HIT, 4, pad=0.16)
    out += _dashed(rects(gpu, evicted, "evicted", palette.EVICT, 3, pad=0.16))  # not a hit's solid
    out += _arrows(cow_pairs, gpu)
    swap_lines, swap_dots = _swaps(swaps, gpu, cpu)
    tier_lines, tier_dots = _tier_moves(moves, gpu, tier)
    out += swap_lines + tier_lines + _slide(swap_dots + tier_dots)
    out += _freed(freed, gpu, windowed, label_px)
    return out


def _dashed(marks: list) -> list:
    for mark in marks:
        mark.update(line={"dash": "dash"})
    return marks


def _freed(freed: Sequence[int], gpu: PoolLayout, windowed: set[int] | None = None,
           label_px: float = 11) -> list:
    """A dotted outline around each block the step freed, and one label under the pool (a label
    per block would sit on the next row's tokens). `windowed`: those a sliding window dropped."""
    ids = [b for b in dict.fromkeys(freed) if 0 <= b < gpu.num_blocks]
    marks = rects(gpu, ids, "freed", palette.FREED, 2)
    if not marks:
        return []
    marks[0].update(line={"dash": "dot"}, hoverinfo="name")
    what = f"block {ids[0]}" if len(ids) == 1 else f"{len(ids)} blocks"
    how = " left the window:" if windowed and windowed.issuperset(ids) else ""
    words = [f"{what}{how} freed (dotted)"]
    boxes = [gpu.box(b) for b in range(gpu.num_blocks)]
    # under the pool's bottom right: the pool's header line (top left) may run the whole width
    # clear of the outlines round the last row (their lines are 3-4 px wide): it was clipped
    xy = [(max(r for _, r, _ in boxes), min(y for _, _, y in boxes) - HALF_H - FREED_GAP)]
    marks.append(go.Scatter(**FAST, x=[x for x, _ in xy], y=[y for _, y in xy], mode="text",
                            text=words, textposition="bottom left", name="freed label",
                            textfont={"color": palette.FREED, "size": label_px}, hoverinfo="skip",
                            showlegend=False))
    return marks


def _centre(layout: PoolLayout, b: int) -> tuple[float, float]:
    left, right, y = layout.box(b)
    return (left + right) / 2, y + HALF_H  # on the row's top edge: the arrow crosses no tokens


def _label_end(layout: PoolLayout, b: int, up: bool, at: float = 0.5) -> tuple[float, float]:
    """Where a copy-on-write arrow starts or ends: the block's id cell (token level; `at`: how
    far across it), on its top or bottom edge; a block-level cell's centre edge."""
    left, right, y = layout.box(b)
    x = left + layout.label_w * at if layout.token_level else (left + right) / 2
    return x, y + (HALF_H if up else -HALF_H)


def _arrows(pairs: Sequence[tuple[int, ...]], gpu: PoolLayout) -> list:
    """An arrow per copy-on-write, from the copied block's id cell to its copy's, never through
    tokens or another block's id: along the gutter left of the strips when the two share a
    column, along the top edge within a row, else straight."""
    xs: list = []
    ys: list = []
    heads: list = []
    for i, (src, dst) in enumerate(pairs):
        if max(src, dst) >= gpu.num_blocks:
            continue
        at = 0.5 if len(pairs) == 1 else 0.2 + 0.6 * i / (len(pairs) - 1)  # side by side
        (l0, _, y_src), (l1, _, y_dst) = gpu.box(src), gpu.box(dst)
        if abs(y_src - y_dst) < 1e-9:  # one row: over the top edge
            path = [_label_end(gpu, src, True, at), _label_end(gpu, dst, True, at)]
        elif gpu.token_level and abs(l0 - l1) < 1e-9:  # one column: down the gutter
            # as far out as the gutter goes (the plot's margin, or the gap between strips), so
            # the arrow reads as one on a projector (it was a 15 px bracket by the strips)
            gutter = l0 - 0.27 + 0.12 * i / max(1, len(pairs) - 1)
            path = [(l0 + 0.05, y_src), (gutter, y_src), (gutter, y_dst), (l1 + 0.05, y_dst)]
        else:
            path = [_label_end(gpu, src, y_dst > y_src, at), _label_end(gpu, dst, y_dst < y_src, at)]
        xs += [p[0] for p in path] + [None]
        ys += [p[1] for p in path] + [None]
        heads += [0] * (len(path) - 1) + [1, 0]
    if not xs:
        return []
    return [go.Scatter(**FAST, x=xs, y=ys, mode="lines+markers", name="copy-on-write",
                       line={"color": palette.COW, "width": 4},
                       marker={"symbol": "arrow", "size": 16, "angleref": "previous",
                               "color": palette.COW, "opacity": heads},
                       hoverinfo="name", showlegend=False)]


Dot = tuple[tuple[float, float], tuple[float, float], str]  # (from, to, colour) of a sliding dot


def _swaps(swaps: Sequence[tuple[int, int, bool]], gpu: PoolLayout, cpu: PoolLayout | None
           ) -> tuple[list, list[Dot]]:
    if not swaps or cpu is None:
        return [], []
    xs: list = []
    ys: list = []
    dots: list[Dot] = []
    for g, c, out in swaps:
        if g >= gpu.num_blocks or c >= cpu.num_blocks:
            continue
        a, b = _centre(gpu, g), _centre(cpu, c)
        src, dst = (a, b) if out else (b, a)
        xs += [src[0], dst[0], None]
        ys += [src[1], dst[1], None]
        dots.append((src, dst, palette.SWAP))
    return [go.Scatter(**FAST, x=xs, y=ys, mode="lines", name="swap",
                       line={"color": palette.SWAP, "width": 2, "dash": "dot"},
                       hoverinfo="name", showlegend=False)], dots


def _tier_moves(moves: Sequence[tuple[int, int, bool]], gpu: PoolLayout, tier: PoolLayout | None
                ) -> tuple[list, list[Dot]]:
    """An arrow per offload (GPU block -> its tier slot) and per load (tier slot -> the GPU
    block it filled): one trace of each kind, its head at the destination."""
    if not moves or tier is None:
        return [], []
    out: list = []
    dots: list[Dot] = []
    for name, colour, offload in (("offload", palette.OFFLOAD, True), ("load", palette.LOAD, False)):
        xs: list = []
        ys: list = []
        for g, slot, kind in moves:
            if kind != offload or not (0 <= g < gpu.num_blocks and 0 <= slot < tier.num_blocks):
                continue
            a, b = _centre(gpu, g), _centre(tier, slot)
            src, dst = (a, b) if offload else (b, a)
            xs += [src[0], dst[0], None]
            ys += [src[1], dst[1], None]
            dots.append((src, dst, colour))
        if xs:
            out.append(go.Scatter(**FAST, x=xs, y=ys, mode="lines+markers", name=name,
                                  line={"color": colour, "width": 2, "dash": "dash"},
                                  marker={"symbol": "arrow", "size": 13, "angleref": "previous",
                                          "color": colour, "opacity": [0, 1, 0] * (len(xs) // 3)},
                                  hoverinfo="name", showlegend=False))
    return out, dots


def _slide(dots: Sequence[Dot]) -> list:
    """The step's sliding dots, each drawn where its bytes went; customdata is where they came
    from. One trace: ui/motion.js slides the points of the first trace named "swap slide"."""
    if not dots:
        return []
    colours = [d[2] for d in dots]
    return [go.Scatter(**FAST, x=[d[1][0] for d in dots], y=[d[1][1] for d in dots], mode="markers",
                       name="swap slide", customdata=[list(d[0]) for d in dots],
                       marker={"size": 12, "symbol": "square",
                               "color": colours[0] if len(set(colours)) == 1 else colours},
                       hoverinfo="skip", showlegend=False)]


def reserved_region(gpu: PoolLayout, ids: Sequence[int]) -> list:
    """Blocks held back from the sequences (a classroom's shrunk pool): one hatched grey
    region over them, named as the teacher's reserve when hovered."""
    marks = rects(gpu, ids, "reserved by the teacher", palette.MUTED, fill=palette.RESERVED, pad=0)
    for mark in marks:
        mark.update(fillpattern={"shape": "/", "fgcolor": palette.MUTED, "size": 8, "solidity": 0.25},
                    hoverinfo="name")
    return marks
