"""The block tables, drawn as in the paper: a row per sequence (a hybrid model's sequence has a
row per KV cache group, kept together), logical block j -> physical block id and how many of its
slots are filled; the pending token after the last entry; an entry a sliding window dropped as an
empty hatched cell; and the lines from every table entry to its physical block. One Heatmap, one
line trace, and one hatch trace when some entry was dropped.

A table too long for the picture's width folds into a "+N" cell: at its end, or, for a sequence
that has dropped entries, at its start, so that the live window (and the pending token) stays
in view; all the rows of one sequence fold alike, so a column is one logical block in each."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import plotly.graph_objects as go

from engine.core.kv_groups import KVCacheGroup
from engine.describe.narration import plural
from engine.describe.snapshot import SequenceView, Snapshot
from viz import palette
from viz.pool_cells import DROPPED, FAST, PENDING, colourscale, escape, owner_category, shorten
from viz.pool_layout import PoolLayout

MAX_LINKS = 4000  # beyond this many table->block lines the picture is a grey blur: skip them
CELL_W = 4.0  # plot units per table entry when the row fits


class TableRow(NamedTuple):
    """One drawn row: a sequence's table in one KV cache group."""

    seq: SequenceView
    group: KVCacheGroup
    table: tuple[int | None, ...]  # None: dropped by the group's sliding window
    label: str  # the group's part of the row's label; "" when the model has one group


def group_label(group: KVCacheGroup) -> str:
    """A group as a row label names it: "full", "sliding 32"."""
    return group.name if group.window is None else f"sliding {group.window}"


def group_words(group: KVCacheGroup) -> str:
    """A group in a block's hover: its attention and, when the model says, its layers."""
    what = "full attention" if group.window is None else f"{group.window}-token sliding window"
    layers = group.layers
    if not layers:  # the dry mode's groups have no layers behind them
        return f"{group.name} ({what})"
    shown = ", ".join(map(str, layers)) if len(layers) <= 6 else f"{layers[0]}, {layers[1]}, …, {layers[-1]}"
    return f"{group.name}, {what} (layers {shown})"


def table_rows(snap: Snapshot, seqs: Sequence[SequenceView]) -> list[TableRow]:
    """The rows to draw: one per sequence, or one per sequence and group (a hybrid model)."""
    groups = snap.kv_cache_groups
    if len(groups) == 1:
        return [TableRow(s, groups[0], s.block_table, "") for s in seqs]
    rows = []
    for s in seqs:
        rows += [TableRow(s, g, s.block_tables.get(g.name, ()), group_label(g)) for g in groups]
    return rows


def row_labels(rows: Sequence[TableRow], top: float, k: float, seq_labels: Mapping[int, str] | None,
               selected_seq: int | None, selected_block: int | None) -> tuple[list[dict], int]:
    """Each table row's label (a hybrid's first row of a sequence names it and its group, the
    next rows their group only) and the widest one's length in characters. Bold: the selected
    sequence, and the rows whose table holds the selected block."""
    notes = []
    widest = 6  # characters of the longest row label ("▶ seq 12"): the left margin fits it
    room = 12 if any(r.label for r in rows) else 18  # the group's name needs its part of the row
    for i, row in enumerate(rows):
        sid = row.seq.seq_id
        label = (seq_labels or {}).get(sid) or f"seq {sid}"
        label = label if len(label) <= room else label[:room - 1] + "…"
        if row.label and i and rows[i - 1].seq.seq_id == sid:
            label = row.label  # a sequence's later rows: its name is on the row above (a phone
            # has no room for it twice)
        elif row.label:
            label += f" · {row.label}"
        if row.seq.status == "loading" and not (i and rows[i - 1].seq.seq_id == sid):
            label += " · loading"  # its prefix blocks come back from the CPU tier this step
        widest = max(widest, len(label) + 2)
        if sid == selected_seq:
            label = f"<b>▶ {label}</b>"
        elif selected_block is not None and row.seq.status != "swapped" and selected_block in row.table:
            label = f"<b>{label}</b>"
        # a tap on the name selects the sequence, as one on its row does (ui/motion.js)
        notes.append(dict(x=-0.3, y=top - i, text=label, xanchor="right", showarrow=False,
                          font={"color": palette.readable_on_white(palette.owner_colour(sid)),
                                "size": 14 * k}, name=f"seq:{sid}", captureevents=True))
    return notes, widest


def table_geometry(rows: Sequence[TableRow], width: float, min_cell: float = 1.0) -> tuple[float, int]:
    """(cell width, entries shown per row) so that the longest table fits the picture's width;
    a cell is never narrower than `min_cell` (the rest of a longer table folds into "+N")."""
    longest = max((len(r.table) + 1 for r in rows), default=1)  # +1: the pending cell
    cell = max(min_cell, min(max(CELL_W, min_cell), width / longest))
    return cell, max(2, int(width / cell + 1e-9))  # width / (width / n) may come out as n - 1 + 0.99…


def _fold(n: int, cols: int, left: bool) -> tuple[int, int, int | None]:
    """(first entry shown, entries shown, column of the "+N" cell or None) for a table of n."""
    if n < cols:
        return 0, n, None
    if left:  # the "+N" cell first, then the last cols - 2 entries and the pending cell
        return n - max(0, cols - 2), max(0, cols - 2), 0
    return 0, cols - 1, cols - 1  # the first cols - 1 entries, then "+N" (no pending cell)


def table_heatmap(snap: Snapshot, rows: Sequence[TableRow], top: float, width: float,
                  token_text: Callable[[int], str], scale: float = 1.0,
                  cells: tuple[float, float] | None = None) -> tuple[go.Heatmap, list[tuple]]:
    """The tables' heatmap (row i at y = top - i) and, per entry drawn, (x, y, seq id, phys id,
    swapped) for the links. customdata[0] of a cell is the sequence id (the click handler).
    cells: (narrowest cell, narrowest cell that also says how full its block is), in plot
    units; by default 1 and 3 (a cell under 1.5 shows no id)."""
    narrow, wide_at = cells or (1.0, 3.0)
    cell, fit = table_geometry(rows, width, narrow)
    cols = min(fit, max((len(r.table) + 1 for r in rows), default=1))
    z = [[None] * cols for _ in rows]
    text = [[""] * cols for _ in rows]
    custom: list[list] = [[None] * cols for _ in rows]
    entries: list[tuple] = []
    wide = cell >= wide_at - 1e-9
    left = {r.seq.seq_id for r in rows if None in r.table}  # these fold at their start
    for i, row in enumerate(rows):
        seq, table, sid = row.seq, row.table, row.seq.seq_id
        swapped = seq.status == "swapped"
        pool = snap.cpu_blocks if swapped else snap.blocks
        about = f"{row.label} table · " if row.label else ""
        first, shown, fold = _fold(len(table), cols, sid in left)
        col0 = 1 if fold == 0 else 0
        for c, j in enumerate(range(first, first + shown), start=col0):
            b = table[j]
            if b is None:  # the window has passed this block: an empty cell, no link
                z[i][c] = DROPPED
                text[i][c] = "dropped" if wide else "—"
                custom[i][c] = [sid, f"{about}logical block {j}: dropped: left the {row.group.window}-token "
                                     f"window, its block went back to the pool"]
                continue
            filled = pool[b].num_filled if b < len(pool) else 0
            name = f"{'c' if swapped else '#'}{b}"
            z[i][c] = owner_category(sid)
            short = name if cell >= min(1.5, narrow) else ""
            text[i][c] = f"{name} {filled}/{snap.block_size}" if wide else short
            custom[i][c] = [sid, f"{about}logical block {j} → {'CPU' if swapped else 'physical'} block "
                                 f"{b}, {filled}/{snap.block_size} filled"]
            entries.append(((c + 0.5) * cell, top - i, sid, b, swapped))
        if fold is not None:  # the entries not shown: the first `first`, or those after the shown
            hidden = first if fold == 0 else len(table) - shown
            z[i][fold], text[i][fold], custom[i][fold] = _fold_cell(row, hidden, fold == 0, sid, about)
        tail = col0 + shown
        cell_after = _tail_cell(seq, wide, token_text) if fold != tail and tail < cols else None
        if cell_after is not None:
            z[i][tail], text[i][tail], custom[i][tail] = cell_after
    heat = go.Heatmap(**FAST,
        z=z, x=[j * cell for j in range(cols + 1)], y=[top - i for i in range(len(rows))], text=text,
        texttemplate="%{text}", textfont={"size": 12 * scale}, customdata=custom, zmin=-0.5,
        zmax=len(colourscale()) // 2 - 0.5, colorscale=colourscale(), showscale=False, xgap=3, ygap=6,
        name="block tables", hoverongaps=False,
        hovertemplate="<b>seq %{customdata[0]}</b><br>%{customdata[1]}<extra></extra>")
    return heat, entries


def _tail_cell(seq: SequenceView, wide: bool, token_text: Callable[[int], str]) -> tuple | None:
    """The cell after a table: what of the prompt chunked prefill has still to bring, or the
    pending token (sampled, no slot yet); None when there is neither."""
    rest = seq.prefill_rest
    if rest:
        words = (f"{plural(rest, 'prompt token')} not computed yet: chunked prefill brings them in a "
                 "chunk a step")
        return PENDING, f"+{rest} to prefill" if wide else f"+{rest}", [seq.seq_id, words]
    if seq.pending_token is None:
        return None
    tok = token_text(seq.pending_token)
    return (PENDING, "▸ " + escape(shorten(tok.strip() or "␣", 16)) if wide else "▸",
            [seq.seq_id, f"pending token {escape(repr(tok))}: sampled, not yet in a slot"])


def _fold_cell(row: TableRow, hidden: int, at_start: bool, sid: int, about: str) -> tuple[int, str, list]:
    """The "+N" cell of a folded table: N entries after the shown ones, or before them."""
    if not at_start:
        return PENDING, f"+{hidden}", [sid, f"{about}{plural(hidden, 'more logical block')}"]
    gone = row.table[:hidden].count(None)
    if gone == hidden:
        words = f"logical blocks 0–{hidden - 1}: dropped, they left the {row.group.window}-token window"
        return DROPPED, f"+{hidden}", [sid, about + words]
    words = plural(hidden, "earlier logical block") + (f", {gone} of them dropped" if gone else "")
    return PENDING, f"+{hidden}", [sid, about + words]


def table_traces(snap: Snapshot, rows: Sequence[TableRow], top: float, gpu: PoolLayout,
                 cpu: PoolLayout | None, token_text: Callable[[int], str], scale: float = 1.0,
                 cells: tuple[float, float] | None = None) -> tuple[list, list[tuple]]:
    """The tables' traces, in drawing order (the links under the cells, the hatching over them),
    and the entries drawn (table_heatmap)."""
    table, entries = table_heatmap(snap, rows, top, gpu.width, token_text, scale, cells)
    line = links(entries, gpu, cpu, "block table links", "rgba(60,70,85,0.32)", 1.2)
    return ([line] if line is not None else []) + [table, *dropped_hatch(table)], entries


def dropped_hatch(heat: go.Heatmap) -> list[go.Scatter]:
    """Light hatching over the tables' dropped cells (one None-separated trace): an entry that is
    no longer there, not a block of some colour."""
    xs: list = []
    ys: list = []
    for row, y in zip(heat.z, heat.y, strict=True):
        for c, cat in enumerate(row):
            if cat == DROPPED:
                a, b = heat.x[c] + 0.06, heat.x[c + 1] - 0.06
                xs += [a, b, b, a, a, None]
                ys += [y - 0.36, y - 0.36, y + 0.36, y + 0.36, y - 0.36, None]
    if not xs:
        return []
    return [go.Scatter(**FAST, x=xs, y=ys, mode="lines", fill="toself", fillcolor="rgba(0,0,0,0)",
                       fillpattern={"shape": "/", "fgcolor": palette.HATCH, "size": 7, "solidity": 0.2},
                       line={"width": 0, "color": palette.HATCH}, name="dropped entries",
                       hoverinfo="skip", showlegend=False)]


def links(entries: Sequence[tuple], gpu: PoolLayout, cpu: PoolLayout | None, name: str,
          colour: str, width: float) -> go.Scatter | None:
    """Lines from table entries to their physical blocks (None-separated: one trace)."""
    if not entries or len(entries) > MAX_LINKS:
        return None
    xs: list = []
    ys: list = []
    for x, y, _, b, swapped in entries:
        layout = cpu if swapped else gpu
        if layout is None or b >= layout.num_blocks:
            continue
        px, py = layout.anchor(b)
        xs += [x, px, None]
        ys += [y - 0.4, py, None]
    return go.Scatter(**FAST, x=xs, y=ys, mode="lines", line={"color": colour, "width": width},
                      hoverinfo="skip", name=name, showlegend=False)
