"""The request timeline: one lane per request, one column per engine step, each cell what the
request did in that step (engine/describe/request_timeline.py): waiting, a prefill chunk (its
tokens), decoding, drafting (kept / drafted), preempted by swap or by recompute, swapped out,
loading from the CPU tier, stalled (holding its blocks, no compute), finished (why). A sample or
beam group is one lane that opens into its sequences (`open_request`). The current step is
outlined (`cursor`: an engine step number; the last serving step at or before it).

    timeline_figure(timeline, cursor=None, *, labels=None, open_request=None, selected=None,
                    box=None, large=False) -> go.Figure

Click contract (ui/views.js): a click on the heatmap "timeline cells" at (x, y) is column x of
row y: layout.meta.rows[y] is [request id, seq id or None] and layout.meta.columns[x] the engine
step (the click selects the request and goes to that step); the "lanes" text trace carries
[request id, seq id or None] in its customdata (a click selects the request, opening a group).

Speed: one heatmap for every cell; words in the cells and in the hover only where there is room
for them (a 64-request, 500-step run draws its 32,000 cells as colours, and says a cell's state
on hover only while the grid has at most HOVER_CELLS cells).
"""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go

from engine.describe.request_timeline import STATES, Cell, Lane, RequestTimeline
from viz import palette
from viz.pool_cells import FAST
from viz.text_width import text_px
from viz.view_frame import (
    ViewSizes,
    base_layout,
    cursor_column,
    discrete_scale,
    key_html,
    step_ticks,
    view_sizes,
)

#: each state's fill; plotly's own text colour on each reads at 4.5:1 (tests/viz/test_run_views.py)
COLOURS = {"waiting": "#d5d9df", "stalled": palette.PENDING, "swapped": palette.SWAP,
           "freed": "#c4c9d0", "decode": palette.OWNERS[0], "draft": palette.OWNERS[3],
           "prefill": palette.OWNERS[1], "loading": palette.LOAD, "preempt_recompute": palette.EVICT,
           "preempt_swap": "#882255", "finished": palette.INK}
WORDS = {"waiting": "waiting", "stalled": "idle, holds blocks", "swapped": "swapped out",
         "freed": "✕ freed", "decode": "decode", "draft": "drafts kept/drafted",
         "prefill": "P prefill", "loading": "⇡ CPU tier load", "preempt_recompute": "✕ recompute",
         "preempt_swap": "⇣ swap out", "finished": "✓ done"}
INDEX = {s: i for i, s in enumerate(STATES)}
SCALE = discrete_scale([COLOURS[s] for s in STATES])
HOVER_CELLS = 6000
KINDS = {"request": "", "samples": "samples", "beams": "beams"}


def cell_text(cell: Cell) -> str:
    """The few characters a cell shows where it is wide enough."""
    s = cell.state
    if s == "prefill":
        return f"P{cell.tokens}" if cell.tokens else "P"  # a fork's child: its parent computed
    if s == "draft":
        return f"{cell.tokens - 1 if cell.drafted else 0}/{cell.drafted}"
    if s == "decode":
        return str(cell.tokens) if cell.tokens > 1 else ""
    return {"preempt_swap": "⇣", "preempt_recompute": "✕", "loading": "⇡", "finished": "✓",
            "freed": "✕", "swapped": "s"}.get(s, "")


def cell_words(cell: Cell) -> str:
    """A cell in words, for its hover."""
    s = cell.state
    if s == "prefill":
        what = f"prefill of {cell.tokens} tokens"
    elif s == "draft":
        what = f"decode with drafts: {cell.tokens} tokens ({cell.drafted} drafted)"
    elif s == "decode":
        what = f"decoding ({cell.tokens} token{'s' if cell.tokens != 1 else ''})"
    elif s == "preempt_swap":
        what = f"preempted by swap ({cell.tokens} blocks to CPU)"
    elif s == "loading":
        what = f"waiting on the CPU tier ({cell.tokens} prompt tokens loading)"
    elif s == "finished":
        what = f"finished ({cell.detail or '?'})"
        return what
    else:
        what = WORDS[s]
    return what + (f", {cell.detail}" if cell.detail else "")


def lane_label(lane: Lane, labels: Mapping[int, str] | None, open_request: int | None,
               phone: bool) -> str:
    """'#3 beams ×3 ▸': the request, its kind and width; ▾ while its sequences are open."""
    name = (labels or {}).get(lane.request_id) or f"req {lane.request_id}"
    kind = KINDS[lane.kind]
    if kind:
        mark = "▾" if lane.request_id == open_request else "▸"
        name += f" ×{lane.width} {mark}" if phone else f" {kind} ×{lane.width} {mark}"
    return name


def _rows(timeline: RequestTimeline, labels, open_request, phone) -> list[tuple]:
    """(label, cells, request id, seq id or None) for each row, a group's sequences under it."""
    rows = []
    for lane, cells in zip(timeline.lanes, timeline.grid(), strict=True):
        rows.append((lane_label(lane, labels, open_request, phone), cells, lane.request_id, None))
        if lane.request_id == open_request and lane.kind != "request":
            for sid, seq_cells in timeline.seq_grid(lane.request_id):
                rows.append((f"  seq {sid}", seq_cells, lane.request_id, sid))
    return rows


def timeline_figure(timeline: RequestTimeline, cursor: int | None = None, *,
                    labels: Mapping[int, str] | None = None, open_request: int | None = None,
                    selected: int | None = None, box: tuple[float, float] | None = None,
                    large: bool = False, title: str = "Requests over time") -> go.Figure:
    sz = view_sizes(box, large)
    cols = timeline.columns
    rows = _rows(timeline, labels, open_request, sz.phone)
    present = {c.state for r in rows for c in r[1] if c is not None}
    key, key_lines = key_html([(COLOURS[s], WORDS[s]) for s in STATES if s in present], sz,
                              (sz.width or 800) - 20)
    g = _geometry(sz, rows, key_lines, len(cols))
    heat = _cells(rows, cols, g, sz)
    at = cursor_column(cols, cursor)
    n, m = len(rows), len(cols)
    where = f" · step {cols[at]} of {cols[-1]}" if at is not None else ""
    layout = base_layout(sz, f"{title}{where}", g["height"], 8,
                         {"columns": list(cols), "rows": [[r[2], r[3]] for r in rows],
                          "cursor": at, "view": "timeline"})
    layout["margin"].update(t=g["top"], b=g["height"] - g["top"] - n * g["row_px"])
    key_note = {"xref": "paper", "yref": "paper", "x": 0, "y": 1, "yshift": 4, "xanchor": "left",
                "yanchor": "bottom", "align": "left", "showarrow": False, "text": key,
                "font": {"size": sz.font}}
    ticks, ticktext = step_ticks(cols, max(2, int(g["plot_w"] // (sz.font * 4))))
    split = g["label_w"] / (g["label_w"] + g["plot_w"])
    # the whole layout in the figure's constructor: fig.update_layout / update_xaxes parse and
    # check every key again, and took 60 of the 90 ms a Back / Next spent on this view
    layout.update(
        shapes=_cursor(at, n) + _selected_rows(rows, selected, m), annotations=[key_note],
        showlegend=False,
        xaxis={"domain": [split, 1], "range": [-0.5, max(m, 1) - 0.5], "tickvals": ticks,
               "ticktext": ticktext, "fixedrange": True, "showgrid": False, "zeroline": False,
               "title": {"text": "engine step", "font": {"size": sz.font}, "standoff": 2},
               "tickfont": {"size": sz.font}},
        yaxis={"range": [n - 0.5, -0.5], "visible": False, "fixedrange": True},
        xaxis2={"domain": [0, split], "range": [0, 1], "visible": False, "fixedrange": True},
        yaxis2={"overlaying": "y", "range": [n - 0.5, -0.5], "visible": False, "fixedrange": True})
    return go.Figure([heat, _lane_labels(rows, g["row_px"], sz, selected)], layout=layout, **FAST)


def _geometry(sz: ViewSizes, rows: list, key_lines: int, m: int) -> dict:
    """Where everything goes: the labels' width, the grid's, the key's lines over the grid, each
    lane's height and the figure's (fitted to the box's height where it has one)."""
    width = sz.width or 800
    label_w = max([text_px(r[0], sz.font) for r in rows] + [40]) + 12
    label_w = min(label_w, width * (0.34 if sz.phone else 0.28))
    plot_w = width - label_w - 24
    top = sz.title * 2.2 + key_lines * sz.font * 1.45
    bottom = sz.font * 3.8
    n = len(rows)
    if sz.height:  # fitted to the box: the lanes share what the title and key leave
        height = sz.height
        row_px = max(2.0, min(sz.font * 1.6, (height - top - bottom) / max(1, n)))
    else:
        row_px = sz.font * 1.5 if n <= 40 else max(6.0, 700 / n)
        height = int(top + bottom + n * row_px + 4)
    return {"label_w": label_w, "plot_w": plot_w, "top": top, "height": height,
            "row_px": row_px, "cell_px": plot_w / max(1, m)}


def _cells(rows: list, cols: tuple[int, ...], g: dict, sz: ViewSizes) -> go.Heatmap:
    """Every cell of the grid as one heatmap: its state's colour, its text where it fits, its
    words on hover while the grid is small enough to carry them."""
    n, m = len(rows), len(cols)
    cell_px, row_px = g["cell_px"], g["row_px"]
    words = n * m <= HOVER_CELLS
    z, text, custom = [], [], []
    for label, cells, _, _ in rows:
        z.append([None if c is None else INDEX[c.state] for c in cells])
        if cell_px >= 12:  # room for a character or two
            text.append(["" if c is None else _fit(cell_text(c), cell_px, row_px, sz.font)
                         for c in cells])
        if words:
            custom.append([[label.strip(), cols[j], c and cell_words(c)]
                           for j, c in enumerate(cells)])
    shown = any(t for row in text for t in row)  # no text fits: none sent (half the JSON)
    return go.Heatmap(
        **FAST, z=z, x=list(range(m)), y=list(range(n)), zmin=-0.5, zmax=len(STATES) - 0.5,
        colorscale=SCALE, showscale=False, xgap=1 if cell_px >= 6 else 0,
        ygap=1 if row_px >= 6 else 0, text=text if shown else None,
        texttemplate="%{text}" if shown else None,
        textfont={"size": min(sz.font, row_px * 0.8)}, name="timeline cells",
        hoverongaps=False, customdata=custom if words else None,
        hovertemplate=("%{customdata[0]} · step %{customdata[1]}:<br>%{customdata[2]}"
                       "<extra></extra>") if words else "click: go to this step<extra></extra>")


def _fit(text: str, cell_px: float, row_px: float, font: float) -> str:
    """The cell's text if it fits its cell whole, else nothing."""
    size = min(font, row_px * 0.8)
    return text if text and text_px(text, size) + 4 <= cell_px and size >= 9 else ""


def _lane_labels(rows, row_px: float, sz: ViewSizes, selected: int | None) -> go.Scatter:
    """Each lane's label left of its row (clickable: it selects the request); where lanes are
    thinner than the type, every k-th one (and the selected one) is named."""
    every = 1 if row_px >= sz.font * 0.95 else max(1, -(-int(sz.font * 1.2) // max(1, int(row_px))))
    ys = [i for i, r in enumerate(rows) if i % every == 0 or r[2] == selected and r[3] is None]
    colours = [palette.INK if rows[i][2] != selected else "#000000" for i in ys]
    return go.Scatter(**FAST, x=[0.99] * len(ys), y=ys, xaxis="x2", yaxis="y2", mode="text",
                      text=[("<b>" + rows[i][0] + "</b>") if rows[i][2] == selected and
                            rows[i][3] is None else rows[i][0] for i in ys],
                      textposition="middle left", name="lanes", showlegend=False,
                      textfont={"size": sz.font, "color": colours},
                      customdata=[[rows[i][2], rows[i][3]] for i in ys],
                      hovertemplate="%{text}: click to select<extra></extra>")


def _cursor(at: int | None, n: int) -> list[dict]:
    """The current step: its column outlined."""
    if at is None:
        return []
    return [{"type": "rect", "xref": "x", "yref": "y", "x0": at - 0.5, "x1": at + 0.5,
             "y0": -0.5, "y1": n - 0.5, "line": {"color": palette.SELECT, "width": 3},
             "fillcolor": "rgba(0,0,0,0)", "layer": "above"}]


def _selected_rows(rows, selected: int | None, m: int) -> list[dict]:
    """The selected request's lane (and its open sequences) outlined."""
    idx = [i for i, r in enumerate(rows) if r[2] == selected]
    if selected is None or not idx:
        return []
    return [{"type": "rect", "xref": "x", "yref": "y", "x0": -0.5, "x1": max(m, 1) - 0.5,
             "y0": min(idx) - 0.5, "y1": max(idx) + 0.5, "fillcolor": "rgba(0,0,0,0)",
             "line": {"color": palette.SELECT, "width": 2, "dash": "dot"}, "layer": "above"}]
