"""The main picture: "page tables -> physical blocks", a pure function of a snapshot.

    pool_figure(snap, events=(), decode=None, *, seq_labels=None, selected_seq=None,
                selected_block=None, block_level=False) -> go.Figure

- Block tables on top, one row per sequence (logical block j -> physical id, slots filled, then
  the pending token), the physical pool below: up to a few hundred blocks every block is drawn
  as its `block_size` slots with each slot's token text in it (viz/pool_layout.py decides),
  bigger pools as one cell per block. Lines join every table entry to its physical block. The
  CPU swap space is drawn, as a thin band under the pool, only when the engine has one; the
  prefix cache's CPU tier likewise, as a labelled band of slots under both.
- A hybrid model (KV cache groups, engine/core/kv_groups.py) gives each sequence a row per group
  ("seq 0 · full", "seq 0 · sliding 32"), kept together; an entry a sliding window dropped is an
  empty hatched cell with no link (viz/block_tables.py).
- The last step's `events` are overlaid and animated in the page (viz/overlays.py); the layout's
  `meta.anim` key changes only when the step does, so a redraw for a selection never replays
  the motion.
- `seq_labels` replaces a sequence's row label (e.g. a student's name in a classroom room);
  `selected_seq` / `selected_block` are outlined, the selected block's links drawn dark.
- Click contract (ui/motion.js): a cell of the trace named "pool" carries its block id in
  customdata[0]; a cell of "block tables" carries its sequence id in customdata[0].
- Composable: the traces come from small builders (pool_cells.pool_heatmap,
  block_tables.table_heatmap / links, overlays.change_overlays / rects) over a PoolLayout, so
  another figure (e.g. N tensor-parallel pools side by side) can place several pools itself.
- Speed: one Heatmap per pool, one for the tables, a few line traces; no per-cell shapes or
  annotations, and plotly's validation skipped (tests validate the JSON).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence

import plotly.graph_objects as go

from engine.core.events import Event
from engine.describe.snapshot import SequenceView, Snapshot
from viz import figure_text, palette
from viz.bands import Band, bands_below
from viz.block_tables import TableRow, group_words, links, row_labels, table_rows, table_traces
from viz.draft_marks import draft_marks, rolled_back
from viz.figure_text import FONT
from viz.fit import (
    LINE_SPACING,
    MAX_ROWS,
    PHONE_PX,
    ROW_PX,
    Content,
    Sizes,
    content_of,
    fitted_sizes,
    laptop_sizes,
    title_px,
)
from viz.overlays import change_overlays, rects, reserved_region
from viz.pool_cells import FAST, block_ids, fold_id_cells, pool_heatmap, tier_heatmap
from viz.pool_layout import cpu_layout, table_top
from viz.text_width import text_px


def _held(seq: SequenceView) -> set[int]:
    """The blocks a sequence's tables hold, every group's (dropped entries are None)."""
    return {b for t in seq.block_tables.values() for b in t if b is not None}


def _pending_slots(rows: Sequence[TableRow], bs: int, token_text: Callable[[int], str]
                   ) -> dict[int, tuple[int, str]]:
    """block id -> (slot, text) of each pending token's slot: in the last block of the table of
    each of its sequence's groups (the token is written in every group)."""
    out = {}
    for r in rows:
        s = r.seq
        if s.pending_token is not None and s.status != "swapped" and s.num_tokens % bs and r.table:
            out[r.table[-1]] = (s.num_tokens % bs, token_text(s.pending_token))
    return out


def anim_key(snap: Snapshot, events: Sequence[Event]) -> str:
    """Changes when the picture shows another step: the page animates each key once."""
    changes = hash(tuple((e.kind, e.block_ids) for e in events)) & 0xFFFFFF
    return f"{snap.mode}:{snap.num_blocks}x{snap.block_size}:{snap.step}:{len(events)}:{changes:x}"



def _keep(snap: Snapshot, events: Sequence[Event], selected_block: int | None) -> set[int]:
    """The blocks that must be drawn: those holding data, those the step changed (a swap's
    pairs: their GPU side), the selected one; the others may fold."""
    keep = {b.block_id for b in snap.blocks if b.state != "free"}
    for e in events:
        if e.kind == "swap_out":
            keep.update(e.block_ids[::2])
        elif e.kind == "swap_in":
            keep.update(e.block_ids[1::2])
        else:
            keep.update(e.block_ids)
    if selected_block is not None:
        keep.add(selected_block)
    return keep


def _table_texts(snap: Snapshot, rows: Sequence[TableRow], token_text: Callable[[int], str]
                 ) -> tuple[list[str], list[str]]:
    """(narrow, wide) texts the tables' cells may show: an id alone, or with its fill."""
    bs = snap.block_size
    narrow = [f"#{max(snap.num_blocks - 1, len(snap.cpu_blocks) - 1, 0)}", "+99"]
    wide = [f"{n} {bs}/{bs}" for n in narrow[:1]] + ["dropped"]
    for r in rows:
        rest = r.seq.prefill_rest
        if rest:
            wide.append(f"+{rest} to prefill")
        elif r.seq.pending_token is not None:
            wide.append("▸ " + token_text(r.seq.pending_token).strip()[:16])
    return narrow, wide


def _sizes(snap: Snapshot, events: Sequence[Event], rows: Sequence[TableRow], keep: set[int],
           pending: dict, token_text: Callable[[int], str], labels: list[str], block_level: bool,
           large: bool, box: tuple[float, float] | None, bands: int = 0,
           id_folds: bool = False) -> Sizes:
    if not box or not box[0]:
        return laptop_sizes(snap.num_blocks, snap.block_size, block_level, keep, large, id_folds)
    slots, ids = content_of(snap.blocks, keep, pending, token_text, snap.num_blocks, snap.block_size)
    ex = figure_text.extras(events, any(None in r.table for r in rows))
    head = 1 if figure_text.groups_title(snap) else 0
    content = Content(snap.num_blocks, snap.block_size, block_level, keep, slots, ids, labels,
                      _table_texts(snap, rows, token_text), len(rows), len(snap.cpu_blocks),
                      len(snap.tier_blocks), any(not s.block_table for s in snap.sequences.values()),
                      any(e.kind in ("free", "reject", "drop") for e in events),
                      lambda chars: head + len(figure_text.legend(chars, ex)), bands,
                      re.sub("<[^>]*>", "", figure_text.title(snap, box[0] < PHONE_PX)), id_folds)
    return fitted_sizes(content, box, large)


def pool_figure(snap: Snapshot, events: Sequence[Event] = (),
                decode: Callable[[list[int]], str] | None = None, *,
                seq_labels: Mapping[int, str] | None = None, selected_seq: int | None = None,
                selected_block: int | None = None, block_level: bool = False,
                large: bool = False, reserved: Collection[int] = (),
                box: tuple[float, float] | None = None, bands: Sequence[Band] = (),
                lit: Collection[int] = (), every_block: bool = False) -> go.Figure:
    """The whole picture for one snapshot and the events of the step that led to it.
    `large`: presenter mode (large type, for a projector). `reserved`: blocks held back from the
    sequences drawn (a classroom's shrunk pool): one hatched region, no table rows. `box`: the
    (width, height) in pixels the page has for the picture (height 0: as tall as it needs): the
    picture is fitted to it (viz/fit.py); without it, the laptop's fixed sizes. `bands`: labelled
    rows under the pool that a lesson page asks for (viz/bands.py: a hash chain, a reservation).
    `lit`: blocks outlined as one request's (a request selected in the timeline).
    `every_block`: every block can be clicked (a lesson asks which block): a folded run of free
    blocks is drawn as rows of their id cells."""
    decode = decode or (lambda ids: " ".join(map(str, ids)))
    memo: dict[int, str] = {}

    def token_text(t: int) -> str:
        if t not in memo:
            memo[t] = decode([t])
        return memo[t]

    bs = snap.block_size
    reserved = frozenset(reserved)
    seqs = [s for s in snap.sequences.values()
            if s.block_table and not (reserved and _held(s) <= reserved)]
    rows = table_rows(snap, seqs)
    hidden = 0
    most = MAX_ROWS if snap.num_blocks <= 256 else 3  # a big pool needs the room for its rows
    if box and box[0] and len(rows) > most:  # a fitted picture: the first tables, counted
        per_seq = len(rows) // max(1, len(seqs))
        shown = max(1, most // per_seq)
        hidden = len(seqs) - shown
        rows = table_rows(snap, seqs[:shown])
    pending = _pending_slots(rows, bs, token_text)
    gone = rolled_back(events, snap)  # a rolled-back slot shows its struck-out draft this step
    pending = {b: p for b, p in pending.items() if (b, p[0]) not in gone}
    keep = _keep(snap, events, selected_block)
    drawn = selected_block is not None and 0 <= selected_block < snap.num_blocks
    # the first table row; the last sits 2 rows above the pool (none: the pool's header is the top)
    top = table_top(len(rows), any(not s.block_table for s in snap.sequences.values()))
    plain, widest = row_labels(rows, top, 1.0, seq_labels, selected_seq, None)
    sz = _sizes(snap, events, rows, keep, pending, token_text,
                ["▶ " + re.sub("<[^>]*>", "", n["text"]) for n in plain], block_level, large, box,
                len(bands), every_block)
    k, kt, gpu = sz.k, sz.kt, sz.gpu
    small = max(k, 14 / 11) if large else k  # 11 px text (the CPU bands): 14 px and up presenting
    cpu = cpu_layout(len(snap.cpu_blocks), bs, gpu) if snap.cpu_blocks else None
    tier = cpu_layout(len(snap.tier_blocks), bs, cpu or gpu) if snap.tier_blocks else None
    groups = snap.kv_cache_groups
    words = {g.name: group_words(g) for g in groups} if len(groups) > 1 or groups[0].sliding else None
    # a phone's slots too narrow for their tokens draw none (the strip under the pool lists them)
    chars = 0 if sz.fitted and sz.narrow and sz.chars is not None else sz.chars
    if sz.fitted and chars is None:  # fitted and whole: no token is shortened
        chars = 10 ** 6
    if sz.fitted and not gpu.token_level:  # a cell's ref count fits its row
        kt = min(kt, 0.62 * sz.row_px / 11)
    traces: list = [pool_heatmap(snap.blocks, gpu, token_text, pending, "pool", scale=kt,
                                 plot_px=sz.plot_px, blank=reserved, groups=words, chars=chars,
                                 fits=sz.fits if sz.fitted else None)]
    marks = {g.name: "ˢ" for g in groups if g.sliding} if len(groups) > 1 else None
    unit = sz.plot_px / (gpu.width + 0.6) if sz.fitted else None  # pixels per plot unit
    ids = block_ids(snap.blocks, gpu, kt, reserved, marks, unit and gpu.label_w * unit)
    traces += [ids] if ids is not None else []
    traces += fold_id_cells(gpu, snap.block_size, kt)
    if cpu is not None:
        traces.append(pool_heatmap(snap.cpu_blocks, cpu, token_text, {}, "cpu pool", "c", scale=small,
                                   plot_px=sz.plot_px, groups=words))
    if tier is not None:
        traces.append(tier_heatmap(snap.tier_blocks, snap.tier_lru, tier, token_text, scale=small,
                                   cell_px=unit and tier.cell_w * unit))
    entries: list[tuple] = []
    if rows:
        tables, entries = table_traces(snap, rows, top, gpu, cpu, token_text, k, sz.cells)
        traces += tables
    in_use = [b.block_id for b in snap.blocks if b.state == "used"]
    traces += change_overlays([e for e in events if not reserved.intersection(e.block_ids)], gpu,
                              cpu, in_use, tier, label_px=11 * small)
    traces += draft_marks(events, snap, gpu, token_text, kt)
    traces += reserved_region(gpu, sorted(reserved))
    # `lit`: the blocks of a request selected in the timeline (ui/views_panel.py), outlined
    traces += rects(gpu, lit, "selected request", palette.SELECT, 2.5, pad=0.15) if lit else []
    if drawn:
        chosen = [e for e in entries if e[3] == selected_block and not e[4]]
        line = links(chosen, gpu, None, "selected links", palette.SELECT, 2.5)
        traces += ([line] if line is not None else []) + rects(gpu, [selected_block], "selected",
                                                               palette.SELECT, 3.5, pad=0.22)
    notes, _ = row_labels(rows, top, k * (12 / 14 if sz.fitted else 1.0), seq_labels, selected_seq,
                          selected_block if drawn else None)
    top, bottom = _notes(notes, snap, rows, seqs, gpu, cpu, tier, top, sz, seq_labels, reserved,
                         bool(marks), any(t.name == "freed label" for t in traces), len(entries),
                         hidden)
    if bands:
        drawn_bands, band_notes, bottom = bands_below(bands, bottom, gpu.width, k,
                                                      sz.plot_px if sz.fitted else 0.0)
        traces += drawn_bands
        notes += band_notes
    bottom = _strip(notes, snap, rows, selected_seq, sz, token_text, bottom)
    mine = [i for i, r in enumerate(rows) if r.seq.seq_id == selected_seq]
    if mine:  # one outline around all the selected sequence's rows (they are kept together)
        lo, hi = 2.0 + len(rows) - 1 - mine[-1] - 0.5, 2.0 + len(rows) - 1 - mine[0] + 0.5
        traces.append(go.Scatter(**FAST, x=[-0.15, gpu.width + 0.15, gpu.width + 0.15, -0.15, -0.15],
                                 y=[lo, lo, hi, hi, lo], mode="lines",
                                 line={"color": palette.SELECT, "width": 1.5, "dash": "dot"},
                                 name="selected sequence", hoverinfo="skip", showlegend=False))
    # the layout in the figure's constructor: fig.update_layout / update_xaxes parse and check
    # every key again (about half the server's time of a Back / Next on this picture)
    layout = _frame(snap, events, notes, sz, large, top, bottom, widest,
                    any(t.name == "dropped entries" for t in traces), box)
    return go.Figure(traces, layout=layout, **FAST)


def _notes(notes: list, snap: Snapshot, rows: Sequence[TableRow], seqs: list, gpu, cpu, tier,
           top: float, sz: Sizes, seq_labels: Mapping[int, str] | None, reserved: frozenset,
           marks: bool, freed: bool, entries: int, hidden: int = 0) -> tuple[float, float]:
    """The headers and notes over and under the tables and the pool, added to `notes`; returns
    the picture's (top, bottom) in rows."""
    font = {"size": sz.note_px, "color": palette.MUTED}
    room = _note_room(sz)

    def fitting(words: Callable[[bool], str]) -> str:  # the short words where the long run out
        long = words(sz.narrow)
        wide = text_px(long, sz.note_px) * 1.08 > room - 16  # a margin for the browser's hinting
        return words(True) if sz.fitted and wide else long

    if rows:
        more = f" · {hidden} more sequences' tables not drawn" if hidden else ""
        notes.append(dict(x=0, y=top + 0.55, xanchor="left", yanchor="bottom", showarrow=False,
                          text=fitting(lambda n: figure_text.tables_header(
                              len(snap.kv_cache_groups) > 1, n or bool(hidden)) + more), font=font))
    for row, first, last in () if gpu.fold_cells else gpu.folds:  # id cells say it themselves
        notes.append(dict(x=gpu.width / 2, y=gpu.y0 - row, showarrow=False, font=font,
                          text=f"blocks {first}–{last} free ({last - first + 1} blocks)"))
    waiting = [s for s in snap.sequences.values() if not s.block_table]
    if waiting:  # a request added but not scheduled yet holds no block: say it is there
        notes.append(dict(x=0, y=top + (1.5 if seqs else 1.2), xanchor="left", yanchor="bottom",
                          showarrow=False, text=_waiting_line(waiting, seq_labels, sz, room),
                          font={"size": sz.note_px, "color": palette.INK}))
    notes.append(dict(x=0, y=0.55, xanchor="left", yanchor="bottom", showarrow=False, font=font,
                      text=fitting(lambda n: figure_text.pool_header(gpu.token_level, marks,
                                                                     len(reserved), n))))
    bottom = -gpu.rows + 0.4 - (0.85 if freed else 0.0)  # the freed label sits under the pool
    for band, name in ((cpu, lambda n: "CPU swap space"),
                       (tier, lambda n: "CPU tier of the prefix cache" + (
                           "" if n else ": cached blocks kept by hash (LRU)"))):
        if band is not None:
            notes.append(dict(x=0, y=band.y0 + 0.55, text=fitting(name), xanchor="left",
                              yanchor="bottom", showarrow=False, font=font))
            bottom = band.y0 - band.rows + 0.4
    if entries > 4000:
        notes.append(dict(x=gpu.width, y=top + 0.55, text=f"{entries} table entries: links not drawn",
                          xanchor="right", yanchor="bottom", showarrow=False, font=font))
    return top + (1.0 if waiting else 0.0), bottom  # room for the waiting line


def _note_room(sz: Sizes) -> float:
    """The pixels a line of notes may take: the plot's width, and on a phone the left margin
    too (_frame starts the picture's lines at its left edge there: they were cut at the right)."""
    return sz.plot_px + (sz.margin_l - 8 if sz.fitted and sz.narrow and sz.margin_l else 0.0)


def _waiting_line(waiting: list, seq_labels: Mapping[int, str] | None, sz: Sizes,
                  room: float) -> str:
    """"waiting, no blocks yet: a · b · +2 more": as many names as the line holds."""
    names = [(seq_labels or {}).get(s.seq_id) or f"seq {s.seq_id}" for s in waiting]
    for n in range(min(6, len(names)), 0, -1):
        more = f" · +{len(names) - n} more" if len(names) > n else ""
        line = f"waiting, no blocks yet: {' · '.join(names[:n])}{more}"
        if not sz.fitted or text_px(line, sz.note_px) * 1.08 <= room - 8:
            return line
    return f"waiting, no blocks yet: {len(names)}"


def _strip(notes: list, snap: Snapshot, rows: Sequence[TableRow], selected_seq: int | None,
           sz: Sizes, token_text: Callable[[int], str], bottom: float) -> float:
    """A narrow picture (a phone) whose slots cannot hold their tokens lists the selected
    sequence's tokens, block by block, under the pool; returns the new bottom."""
    if not (sz.fitted and sz.narrow and sz.chars is not None and rows):
        return bottom
    row = next((r for r in rows if r.seq.seq_id == selected_seq), rows[-1])
    lines = figure_text.token_lines(row.table, snap.blocks, token_text, _note_room(sz) - 8, sz.note_px)
    if not lines:
        return bottom
    y = bottom - 0.6
    notes.append(dict(x=0, y=y, xanchor="left", yanchor="bottom", showarrow=False,
                      text=f"<b>seq {row.seq.seq_id}, block by block</b>",
                      font={"size": sz.note_px, "color": palette.INK}))
    for line in lines[:12]:
        y -= 1.0
        notes.append(dict(x=0, y=y, xanchor="left", yanchor="bottom", showarrow=False, text=line,
                          font={"size": sz.note_px, "color": palette.INK}))
    return y - 0.3


def _frame(snap: Snapshot, events: Sequence[Event], notes: list, sz: Sizes, large: bool,
           top: float, bottom: float, widest: int, dropped: bool,
           box: tuple[float, float] | None = None) -> dict:
    """The layout: title, legend, margins, height and the axes' ranges."""
    k = sz.k
    budget = sz.legend_chars or (95 if large else 150)  # visible characters a legend line holds
    lines = figure_text.legend(budget, figure_text.extras(events, dropped))
    groups_words = figure_text.groups_title(snap)
    if groups_words and (large or sz.fitted):  # no room in the title: a line of its own
        lines = [groups_words] + lines
        groups_words = ""
    head = figure_text.title(snap, sz.narrow) + (f" · {groups_words}" if groups_words else "")
    # the title's own type is the key's: plotly spaces every <br> line at 1.3x the title's
    # type, so the key's lines sit as close as their type allows and the head grows in a span
    key_px = sz.legend_px or 12 * k
    text = f"<span style='font-size:{title_px(k):.0f}px'>{head}</span><br>{'<br>'.join(lines)}"
    span = top + 1.6 - bottom
    margin_b = 8
    if sz.fitted:  # the rows at the fit's height; what the box has beyond them stays white
        margin_t = sz.margin_t
        height = sz.height if sz.fixed_height else int(margin_t + span * sz.row_px + 8)
        margin_b = max(8, height - margin_t - span * sz.row_px)
        y_range = [bottom - 0.2, top + 1.3]
        margin_l = sz.margin_l
    else:
        grown = 18 * k * max(0, len(lines) - (2 if large else 1))  # legend lines past the usual
        key = title_px(k) * 1.45 + key_px * LINE_SPACING * len(lines) + 12 * k  # lines whole
        margin_t = max(72 * k + (24 if large else 0) + grown, key)
        height = int(min(2000, max(320, (84 + (ROW_PX if span <= 30 else 21) * span) * k + grown)))
        y_range = [bottom - 0.2, top + 1.3]
        margin_l = max(78, 8 + 8 * widest) * k
    if sz.fitted and sz.narrow:  # a phone: the lines of notes start at the picture's left edge
        edge = -(margin_l - 4) / max(sz.plot_px, 1.0)
        for n in notes:
            if n.get("x") == 0 and n.get("xanchor") == "left":
                n.update(xref="paper", x=edge)
    return dict(
        annotations=notes[:72],  # one label per sequence row, not per cell
        height=height, margin={"l": margin_l, "r": 8, "t": margin_t, "b": margin_b},
        font={"family": FONT, "color": palette.INK},
        paper_bgcolor="#ffffff", plot_bgcolor=palette.BORDER, showlegend=False,
        hoverlabel={"align": "left", "font": {"size": 13 * k}}, dragmode=False,
        meta={"anim": anim_key(snap, events), "fit": _fit_meta(sz, box)},
        title={"text": text, "x": 0.01, "xanchor": "left", "yref": "container", "y": 1,
               "yanchor": "top", "pad": {"t": 12 * k}, "font": {"size": key_px}},
        xaxis={"visible": False, "fixedrange": True, "range": [-0.3, sz.gpu.width + 0.3]},
        yaxis={"visible": False, "fixedrange": True, "range": y_range},
    )


def _fit_meta(sz: Sizes, box: tuple[float, float] | None) -> dict:
    """What the fit chose, for the page's tests and the curious: the box it was drawn for, the
    token type, whether every text is whole."""
    return {"token_px": round(10 * sz.kt, 1), "whole": sz.chars is None and sz.fitted and sz.within,
            "fitted": sz.fitted, "slots": sz.gpu.token_level, "box": list(box) if box else None}
