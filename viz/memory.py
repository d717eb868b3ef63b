"""Memory over time: the GPU pool's blocks per step stacked by state (owned by one sequence,
shared, cached, free) up to the pool's size, the CPU's (swapped-out sequences, the prefix
cache's tier) stacked below zero, the step's preemptions, evictions, prefix hits and tier loads
marked above, the current step outlined; over it a strip of live figures at that step (KV in
use, the prefix hit rate so far, tokens in the step, preemptions so far, and with drafts the
tokens each decoding sequence gained in the step).

    memory_figure(points, num_blocks, cursor=None, *, box=None, large=False) -> go.Figure

`points` are engine/describe/memory_use.MemoryPoint, one per serving step. Each series is one
step-shaped area, each kind of mark one scatter: the figure's size does not grow with the pool.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import plotly.graph_objects as go

from engine.describe.memory_use import MemoryPoint
from viz import palette
from viz.pool_cells import FAST
from viz.text_width import text_px
from viz.view_frame import ViewSizes, base_layout, cursor_column, legend_px, step_ticks, view_sizes

#: (field, legend words, fill) of the GPU pool's stack, bottom up, then the CPU's, top down
GPU = (("owned", "owned by one sequence", palette.OWNERS[0]), ("shared", "shared", palette.SHARED),
       ("cached", "cached (prefix cache)", palette.CACHED), ("free", "free", "#eef0f3"))
CPU = (("swapped", "swapped out (CPU)", palette.SWAP), ("tier", "CPU tier", palette.OFFLOAD))
#: (field, words, symbol, colour, key) of the marks above the pool
MARKS = (("preemptions", "preemption", "triangle-down", palette.EVICT, "▼ preempt"),
         ("evictions", "eviction", "x", palette.FREED, "✖ evict"),
         ("prefix_hits", "prefix-hit block", "diamond", palette.PREFIX_HIT, "◆ prefix hit"),
         ("loads", "block loaded from the CPU tier", "triangle-up", palette.LOAD, "▲ tier load"))


def live_figures(points: Sequence[MemoryPoint], at: int, num_blocks: int) -> list[tuple[str, str]]:
    """(value, words) of the strip at column `at`: what the run looks like at that step."""
    p = points[at]
    upto = points[: at + 1]
    prompt = sum(q.prompt_tokens for q in upto)
    hits = sum(q.hit_tokens for q in upto)
    out = [(f"{p.used}/{num_blocks}", "KV in use"),
           (f"{hits / prompt:.0%}" if prompt else "–", "prefix hits"),
           (str(p.tokens), "tokens in step"),
           (str(sum(q.preemptions for q in upto)), "preemptions")]
    if any(q.drafted for q in points):  # tokens a decoding sequence gained: 1 without drafts
        out.append((f"{p.output_tokens / p.decodes:.2f}" if p.decodes else "–", "tokens/seq"))
    return out


def memory_figure(points: Sequence[MemoryPoint], num_blocks: int, cursor: int | None = None, *,
                  box: tuple[float, float] | None = None, large: bool = False,
                  title: str = "Memory over time") -> go.Figure:
    sz = view_sizes(box, large)
    cols = [p.step for p in points]
    m = len(points)
    xs = list(range(m))
    cpu_top = max([p.swapped + p.tier for p in points] + [0])
    areas = [_area(xs, [getattr(p, f) for p in points], words, colour, "gpu")
             for f, words, colour in GPU]
    areas += [_area(xs, [-getattr(p, f) for p in points], words, colour, "cpu")
              for f, words, colour in CPU if any(getattr(p, f) for p in points)]
    marks = [t for i, (f, words, symbol, colour, _) in enumerate(MARKS)
             if (t := _marks(points, f, words, symbol, colour, num_blocks * (1.08 + 0.09 * i)))]
    at = cursor_column(cols, cursor)
    fig = go.Figure(areas + marks, **FAST)
    width = sz.width or 800
    side = width >= 600 and (sz.large or sz.height is not None)
    right = max(text_px(t.name, sz.font) for t in areas) + sz.font * 3 if side else 10
    head, strip, lines = _title(title, points, at, num_blocks, sz, width, [t.name for t in marks])
    top = sz.title * 2 + lines * sz.font * 1.75 + 6
    bottom = sz.font * 3.8 + (0 if side else legend_px(areas, sz, width - 60))
    height = sz.height or int(top + bottom + (300 if not sz.phone else 200))
    layout = base_layout(sz, head, height, sz.font * 3.2,
                         {"columns": cols, "cursor": at, "view": "memory"})
    layout["margin"].update(t=top, b=bottom, r=right)
    if side:
        layout["legend"].update(orientation="v", x=1.01, xanchor="left", y=1, yanchor="top",
                                yref="paper")
    fig.update_layout(**layout, showlegend=True, shapes=_cursor(at, cpu_top, num_blocks),
                      annotations=[{"xref": "paper", "yref": "paper", "x": 0, "y": 1, "yshift": 4,
                                    "xanchor": "left", "yanchor": "bottom", "align": "left",
                                    "showarrow": False, "text": strip}] if strip else [])
    ticks, ticktext = step_ticks(cols, max(2, int((width - 80 - right) // (sz.font * 4))))
    fig.update_xaxes(range=[-0.5, max(m, 1) - 0.5], tickvals=ticks, ticktext=ticktext,
                     fixedrange=True, showgrid=False, zeroline=False, tickfont={"size": sz.font},
                     title={"text": "engine step", "font": {"size": sz.font}, "standoff": 2})
    fig.update_yaxes(range=[-cpu_top * 1.05 - 0.5, num_blocks * (1.08 + 0.09 * len(MARKS))],
                     fixedrange=True, tickfont={"size": sz.font}, zeroline=True,
                     zerolinecolor=palette.INK, gridcolor=palette.BORDER,
                     title={"text": "blocks", "font": {"size": sz.font}, "standoff": 2})
    return fig


def _title(title: str, points: Sequence[MemoryPoint], at: int | None, num_blocks: int,
           sz: ViewSizes, width: float, marks: list[str]) -> tuple[str, str, int]:
    """(title, strip, the strip's lines): the title with the marks' key where both fit a line
    (else the key opens the strip), the live figures (large numbers, their words beside them)
    as many a line as the width holds."""
    key = _marks_key(marks)
    lines: list[str] = []
    if text_px(_plain(f"{title}{key}"), sz.title) < width - 20:
        title += key
    elif key:
        lines.append(key[3:])
    if at is None:
        return title, "<br>".join(lines), len(lines)
    big = sz.font * 1.35
    row, used = [], 0.0
    for value, words in live_figures(points, at, num_blocks):
        w = text_px(value, big, bold=True) + text_px(f" {words}", sz.font) + sz.font * 1.6
        if row and used + w > width - 20:
            lines.append("   ".join(row))
            row, used = [], 0.0
        row.append(f"<b style='font-size:{big:.0f}px'>{value}</b> "
                   f"<span style='font-size:{sz.font:.0f}px'>{words}</span>")
        used += w
    lines.append("   ".join(row))
    return title, "<br>".join(lines), len(lines)


def _plain(html: str) -> str:
    return re.sub("<[^>]*>", "", html)


def _area(xs: list[int], ys: list[int], words: str, colour: str, group: str) -> go.Scatter:
    return go.Scatter(**FAST, x=xs, y=ys, name=words, stackgroup=group, mode="lines",
                      line={"width": 0.5, "color": palette.MUTED, "shape": "hvh"},
                      fillcolor=colour, hovertemplate=f"{words}: %{{y}}<extra></extra>")


def _marks(points: Sequence[MemoryPoint], field: str, words: str, symbol: str, colour: str,
           y: float) -> go.Scatter | None:
    """One mark per step in which `field` happened, its count on hover."""
    hit = [(i, getattr(p, field), p.step) for i, p in enumerate(points) if getattr(p, field)]
    if not hit:
        return None
    return go.Scatter(**FAST, x=[i for i, _, _ in hit], y=[y] * len(hit), mode="markers",
                      name=words, showlegend=False,
                      marker={"symbol": symbol, "size": 11, "color": colour,
                                          "line": {"color": colour, "width": 1.5}},
                      customdata=[[n, s] for _, n, s in hit],
                      hovertemplate=f"step %{{customdata[1]}}: %{{customdata[0]}} × {words}"
                                    "<extra></extra>")


def _marks_key(names: list[str]) -> str:
    """The marks' key, in the title's line: a legend entry each would not fit a slide."""
    keys = {words: (colour, key) for _, words, _, colour, key in MARKS}
    parts = [f"<span style='color:{keys[n][0]}'>{keys[n][1][0]}</span>{keys[n][1][1:]}"
             for n in names if n in keys]
    return (" · " + " ".join(parts)) if parts else ""


def _cursor(at: int | None, cpu_top: int, num_blocks: int) -> list[dict]:
    if at is None:
        return []
    return [{"type": "rect", "xref": "x", "yref": "y", "x0": at - 0.5, "x1": at + 0.5,
             "y0": -cpu_top * 1.05 - 0.5, "y1": num_blocks * (1.08 + 0.09 * len(MARKS)),
             "line": {"color": palette.SELECT, "width": 3}, "fillcolor": "rgba(0,0,0,0)",
             "layer": "above"}]
