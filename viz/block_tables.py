"""The block tables, drawn as in the paper: a row per sequence, logical block j -> physical block
id and how many of its slots are filled; the pending token after the last entry; and the lines
from every table entry to its physical block. One Heatmap and one line trace."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import plotly.graph_objects as go

from engine.core.narration import plural
from engine.core.snapshot import SequenceView, Snapshot
from viz.pool_cells import FAST, PENDING, colourscale, escape, owner_category, shorten
from viz.pool_layout import PoolLayout

MAX_LINKS = 4000  # beyond this many table->block lines the picture is a grey blur: skip them
CELL_W = 4.0  # plot units per table entry when the row fits


def table_geometry(seqs: Sequence[SequenceView], width: float) -> tuple[float, int]:
    """(cell width, entries shown per row) so that the longest table fits the picture's width."""
    longest = max((len(s.block_table) + 1 for s in seqs), default=1)  # +1: the pending cell
    cell = max(1.0, min(CELL_W, width / longest))
    return cell, max(2, int(width // cell))


def table_heatmap(snap: Snapshot, seqs: Sequence[SequenceView], top: float, width: float,
                  token_text: Callable[[int], str], scale: float = 1.0) -> tuple[go.Heatmap, list[tuple]]:
    """The tables' heatmap (row i at y = top - i) and, per entry drawn, (x, y, seq id, phys id,
    swapped) for the links. customdata[0] of a cell is the sequence id (the click handler)."""
    cell, fit = table_geometry(seqs, width)
    cols = min(fit, max((len(s.block_table) + 1 for s in seqs), default=1))
    z = [[None] * cols for _ in seqs]
    text = [[""] * cols for _ in seqs]
    custom: list[list] = [[None] * cols for _ in seqs]
    entries: list[tuple] = []
    wide = cell >= 3
    for i, seq in enumerate(seqs):
        swapped = seq.status == "swapped"
        pool = snap.cpu_blocks if swapped else snap.blocks
        table = seq.block_table
        shown = len(table) if len(table) < cols else cols - 1
        for j in range(shown):
            b = table[j]
            filled = pool[b].num_filled if b < len(pool) else 0
            name = f"{'c' if swapped else '#'}{b}"
            z[i][j] = owner_category(seq.seq_id)
            text[i][j] = f"{name} {filled}/{snap.block_size}" if wide else (name if cell >= 1.5 else "")
            custom[i][j] = [seq.seq_id, f"logical block {j} → {'CPU' if swapped else 'physical'} block "
                                        f"{b}, {filled}/{snap.block_size} filled"]
            entries.append(((j + 0.5) * cell, top - i, seq.seq_id, b, swapped))
        if shown < len(table):
            z[i][shown] = PENDING
            text[i][shown] = f"+{len(table) - shown}"
            custom[i][shown] = [seq.seq_id, f"{plural(len(table) - shown, 'more logical block')}"]
        elif seq.prefill_rest and shown < cols:  # chunked prefill: the prompt is still coming
            z[i][shown] = PENDING
            text[i][shown] = f"+{seq.prefill_rest} to prefill" if wide else f"+{seq.prefill_rest}"
            custom[i][shown] = [seq.seq_id, f"{plural(seq.prefill_rest, 'prompt token')} not computed yet: "
                                            f"chunked prefill brings them in a chunk a step"]
        elif seq.pending_token is not None and shown < cols:
            tok = token_text(seq.pending_token)
            z[i][shown] = PENDING
            text[i][shown] = "▸ " + escape(shorten(tok.strip() or "␣", 6)) if wide else "▸"
            custom[i][shown] = [seq.seq_id, f"pending token {escape(repr(tok))}: sampled, not yet in a slot"]
    heat = go.Heatmap(**FAST,
        z=z, x=[j * cell for j in range(cols + 1)], y=[top - i for i in range(len(seqs))], text=text,
        texttemplate="%{text}", textfont={"size": 12 * scale}, customdata=custom, zmin=-0.5,
        zmax=len(colourscale()) // 2 - 0.5, colorscale=colourscale(), showscale=False, xgap=3, ygap=6,
        name="block tables", hoverongaps=False,
        hovertemplate="<b>seq %{customdata[0]}</b><br>%{customdata[1]}<extra></extra>")
    return heat, entries


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
