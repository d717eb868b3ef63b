"""Labelled bands under the pool that a lesson page asks for: a sequence's hash chain (lesson 5:
each full block's hash covers its tokens and the hash before it) and a request's contiguous
reservation (lesson 1, the paper's Fig. 3: the slots it used beside those reserved for nothing).

A band is plain data, `(label, cells)`, each cell `(text, weight, kind, hover)`: the cell's width
is its share of the weights; kind is "owner:<seq id>", "reserved" (hatched, never used) or
"hash". One Heatmap row per band, drawn where pool_figure puts it."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from viz import palette
from viz.pool_cells import CACHED, FAST, FREE, colourscale, owner_category
from viz.text_width import text_px

Band = tuple[str, Sequence[tuple[str, float, str, str]]]
ROWS = 2.0  # a band's height in the picture's rows: its label and its cells


def _category(kind: str) -> int:
    if kind.startswith("owner:"):
        return owner_category(int(kind.partition(":")[2]))
    return CACHED if kind == "hash" else FREE


def band_traces(band: Band, y: float, width: float, scale: float, width_px: float = 0.0) -> list:
    """The band's cells at row y (its label just above them), `width` plot units wide
    (`width_px` pixels: a label longer than that keeps only its part before the colon)."""
    label, cells = band
    if width_px and text_px(label, 12 * scale) * 1.08 > width_px - 16:
        label = label.partition(":")[0]
    total = sum(max(w, 0.0) for _, w, _, _ in cells) or 1.0
    edges = [0.0]
    for _, w, _, _ in cells:
        edges.append(edges[-1] + width * max(w, 0.0) / total)
    z = [[_category(kind) for _, _, kind, _ in cells]]
    text = [[t for t, _, _, _ in cells]]
    custom = [[[i, hover] for i, (_, _, _, hover) in enumerate(cells)]]
    heat = go.Heatmap(**FAST, z=z, x=edges, y=[y], text=text, texttemplate="%{text}",
                      textfont={"size": 12 * scale}, customdata=custom, zmin=-0.5,
                      zmax=len(colourscale()) // 2 - 0.5, colorscale=colourscale(), showscale=False,
                      xgap=2, ygap=4, name="band", hovertemplate="%{customdata[1]}<extra></extra>")
    out: list = [heat]
    hatch_x: list = []
    hatch_y: list = []
    for (_, _, kind, _), a, b in zip(cells, edges, edges[1:], strict=False):
        if kind == "reserved":
            hatch_x += [a + 0.05, b - 0.05, b - 0.05, a + 0.05, a + 0.05, None]
            hatch_y += [y - 0.36, y - 0.36, y + 0.36, y + 0.36, y - 0.36, None]
    if hatch_x:
        out.append(go.Scatter(**FAST, x=hatch_x, y=hatch_y, mode="lines", fill="toself",
                              fillcolor="rgba(0,0,0,0)", name="reserved hatch",
                              fillpattern={"shape": "/", "fgcolor": palette.HATCH, "size": 8,
                                           "solidity": 0.25},
                              line={"width": 1.5, "color": palette.MUTED}, hoverinfo="skip",
                              showlegend=False))
    note = dict(x=0, y=y + 0.55, text=label, xanchor="left", yanchor="bottom", showarrow=False,
                font={"size": 12 * scale, "color": palette.MUTED})
    return [out, note]


def bands_below(bands: Sequence[Band], bottom: float, width: float, scale: float,
                width_px: float = 0.0) -> tuple[list, list, float]:
    """(traces, notes, new bottom) for the bands stacked under `bottom`."""
    traces: list = []
    notes: list = []
    for band in bands:
        y = bottom - 1.4
        drawn, note = band_traces(band, y, width, scale, width_px)
        traces += drawn
        notes.append(note)
        bottom = y - 0.6
    return traces, notes, bottom
