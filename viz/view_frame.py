"""What the views of the run share (the request timeline, memory over time, the prefix tree):
their type and size for the box the page gives them, a discrete colour scale, the step cursor.

The box is the room the page measured for the view, (width, height) in CSS pixels, height 0
when the view may be as tall as it needs (a laptop's page scrolls). Presenter mode (`large`)
draws labels at 16 px or more, the size a class reads from the back of a room; a box narrower
than PHONE_PX is a phone's (12 px, short labels).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from viz import palette
from viz.figure_text import FONT
from viz.text_width import text_px

PHONE_PX = 600
PRESENTER_PX = 16  # the smallest label in presenter mode


@dataclass(frozen=True)
class ViewSizes:
    width: int | None  # None: as wide as the page's column
    height: int | None  # None: from the content
    font: float  # labels, ticks, the legend
    title: float
    phone: bool
    large: bool


def view_sizes(box: tuple[float, float] | None, large: bool) -> ViewSizes:
    """The type for a view drawn in `box` (None: a laptop's column of about 800 px)."""
    width = int(box[0]) if box and box[0] >= 100 else None
    height = int(box[1]) if box and box[1] >= 120 else None
    phone = width is not None and width < PHONE_PX
    if large and not phone:
        font = PRESENTER_PX if (width or 800) < 1100 else 20
        return ViewSizes(width, height, font, font + 2, False, True)
    return ViewSizes(width, height, 12.0, 14.0, phone, large)


def discrete_scale(colours: Sequence[str]) -> list[list]:
    """A colour scale giving z = i the colour colours[i] (with zmin -0.5, zmax n - 0.5)."""
    n = len(colours)
    scale: list[list] = []
    for i, c in enumerate(colours):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale


def cursor_column(columns: Sequence[int], step: int | None) -> int | None:
    """The column of the last serving step at or before engine step `step` (None: before the
    first, or no step given)."""
    if step is None:
        return None
    best = None
    for i, c in enumerate(columns):
        if c > step:
            break
        best = i
    return best


def step_ticks(columns: Sequence[int], most: int) -> tuple[list[int], list[str]]:
    """At most `most` x ticks over the columns, labelled with their engine step numbers."""
    if not columns:
        return [], []
    every = max(1, -(-len(columns) // max(1, most)))
    idx = list(range(0, len(columns), every))
    return idx, [str(columns[i]) for i in idx]


def legend_px(entries: Sequence, sz: ViewSizes, width: float) -> float:
    """The height a horizontal legend of these traces takes in a figure `width` wide."""
    if not entries:
        return 0.0
    lines, used = 1, 0.0
    for t in entries:
        w = text_px(t.name or "", sz.font) + sz.font * 2.6
        if used and used + w > width:
            lines, used = lines + 1, 0.0
        used += w
    return lines * sz.font * 1.45 + 6


def key_html(entries: Sequence[tuple], sz: ViewSizes, width: float) -> tuple[str, int]:
    """A colour key wrapped to `width`, as one text for an annotation over a view, and its
    number of lines: each entry (colour, words) is "■ words" in that colour, (colour, words,
    glyph) that glyph (e.g. "▭" for an outline). A legend of plotly's own stacks its entries down
    the side, which a slide's short view has no height for."""
    lines: list[list[str]] = [[]]
    used = 0.0
    for colour, words, *glyph in entries:
        mark = glyph[0] if glyph else "■"
        w = text_px(re.sub("<[^>]*>", "", f"{mark} {words}"), sz.font) + sz.font  # tags take no room
        if lines[-1] and used + w > width:
            lines.append([])
            used = 0.0
        lines[-1].append(f"<span style='color:{colour}'>{mark}</span> {words}")
        used += w
    return "<br>".join("  ".join(line) for line in lines), len(lines)


def base_layout(sz: ViewSizes, title: str, height: int, margin_l: float, meta: dict) -> dict:
    """The layout every view starts from: its title, type, margins and a fixed (no zoom) look."""
    return {
        "height": height, "width": sz.width, "autosize": sz.width is None,
        "margin": {"l": margin_l, "r": 10, "t": sz.title * 2.4, "b": sz.font * 3.4},
        "font": {"family": FONT, "color": palette.INK, "size": sz.font},
        "title": {"text": title, "x": 0.01, "xanchor": "left", "y": 1, "yanchor": "top",
                  "yref": "container", "pad": {"t": 8}, "font": {"size": sz.title}},
        "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff", "dragmode": False,
        "hoverlabel": {"align": "left", "font": {"size": max(13.0, sz.font - 2)}},
        "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": 0, "yanchor": "bottom",
                   "yref": "container", "font": {"size": sz.font}, "itemclick": False,
                   "itemdoubleclick": False, "traceorder": "normal"},
        "meta": meta,
    }


#: a line of a note's text, in its type's size (plotly spaces <br> lines at about 1.3x)
NOTE_LINE = 1.35


def note_figure(title: str, note: str, box: tuple[float, float] | None, large: bool
                ) -> go.Figure:
    """A view with nothing to draw yet: its title and a sentence saying why."""
    sz = view_sizes(box, large)
    if box:  # a phone's box cuts a long sentence at its right edge: break it into lines
        note = _wrapped(note, box[0] - 24, sz.font)
    # the note's lines between the title and the bottom edge (a phone's three lines laid over
    # the title when the figure had room for one)
    lines, bottom = note.count("<br>") + 1, sz.font * 0.8
    height = min(sz.height or 10**6, int(sz.title * 2.4 + bottom + sz.font * (NOTE_LINE * lines + 0.6)))
    fig = go.Figure(layout=base_layout(sz, title, height, 8, {"view": "note"}))
    fig.update_layout(margin={"b": bottom},
                      annotations=[{"text": note, "xref": "paper", "yref": "paper", "x": 0,
                                    "y": 0.5, "xanchor": "left", "align": "left", "showarrow": False,
                                    "font": {"size": sz.font, "color": palette.MUTED}}])
    fig.update_xaxes(visible=False, fixedrange=True)
    fig.update_yaxes(visible=False, fixedrange=True)
    return fig


def _wrapped(text: str, width_px: float, font_px: float) -> str:
    """`text` in lines (joined by <br>) of at most `width_px` at `font_px`."""
    lines = [""]
    for word in text.split():
        joined = f"{lines[-1]} {word}".strip()
        if lines[-1] and text_px(joined, font_px) > width_px:
            lines.append(word)
        else:
            lines[-1] = joined
    return "<br>".join(lines)
