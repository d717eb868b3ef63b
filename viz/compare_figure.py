"""The Compare tab's chart: how many requests each allocator admits into one pool."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go


def admitted_figure(rows: list[dict[str, Any]], pool_tokens: int) -> go.Figure:
    """One bar per allocator (`rows` as `engine.describe.baselines.reservation_fit` gives them, the
    paged row last, drawn in colour)."""
    fig = go.Figure(go.Bar(x=[r["policy"] for r in rows], y=[r["admitted"] for r in rows],
                           marker_color=["#bbbbbb"] * (len(rows) - 1) + ["#4c78a8"]))
    fig.update_layout(title=f"requests that fit in {pool_tokens} token slots", height=320,
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return fig
