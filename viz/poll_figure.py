"""How a class answered a lesson's question (a poll in a room, classroom/poll.py): one bar per
answer given, as many students high, the bars of right answers in the engine's green, the others
grey, each bar's count on it. Drawn under the lesson's picture on the projector; every label
18 px and up there (`large`)."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from viz import palette

RIGHT = palette.NEW  # white text reads on it at 4.5:1 and more
WRONG = palette.CACHED  # the picture's grey ink on it


def poll_figure(counts: Sequence[tuple[str, int, bool]], answer: str, large: bool = False,
                width: int | None = None, height: int | None = None) -> go.Figure:
    """`counts`: (an answer as written, students, right?) per answer given; `answer`: the
    engine's, as written."""
    k = 1.3 if large else 1.0
    font = round(14 * k)
    labels = [a for a, _, _ in counts]
    heights = [n for _, n, _ in counts]
    colours = [RIGHT if ok else WRONG for _, _, ok in counts]
    ink = ["#ffffff" if ok else palette.INK for _, _, ok in counts]
    right = sum(n for _, n, ok in counts if ok)
    total = sum(heights)
    fig = go.Figure(go.Bar(x=labels, y=heights, marker={"color": colours, "line": {"width": 0}},
                           text=[str(n) for n in heights], textposition="inside",
                           insidetextanchor="end", textfont={"size": font, "color": ink},
                           hovertemplate="%{x}: %{y} students<extra></extra>", name="answers"))
    title = (f"The engine: <b>{answer}</b> · {right} of {total} predicted it" if total
             else f"The engine: <b>{answer}</b> · nobody answered")
    fig.update_layout(
        title={"text": title, "font": {"size": round(16 * k)}, "x": 0, "xanchor": "left"},
        height=height or round(200 * k), width=width, margin={"l": 10, "r": 10, "t": round(44 * k), "b": 10},
        paper_bgcolor="#ffffff", plot_bgcolor="#ffffff", showlegend=False, bargap=0.25,
        meta={"view": "poll", "answer": answer, "right": right, "answered": total},
    )
    fig.update_xaxes(type="category", tickfont={"size": font, "color": palette.INK}, fixedrange=True)
    fig.update_yaxes(visible=False, fixedrange=True, rangemode="tozero")
    return fig
