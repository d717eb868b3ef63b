"""The block inspector: the real K and V of one physical block in one layer, tokens on one axis.

Two blocks of a copy-on-write hold the same bytes until the write; this shows it."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots


def kv_figure(k, v, token_labels: Sequence[str], title: str) -> go.Figure:
    """k, v: [block_size, kv_heads, head_dim] tensors (CPU). Rows are slots (labelled by token),
    columns are kv_head x head_dim features."""
    rows = len(token_labels)
    if rows == 0:  # a block no token was written into holds nothing to show (the caller says so)
        raise ValueError("this block holds no tokens: there is no K/V to show")
    k2 = k[:rows].reshape(rows, -1).tolist()
    v2 = v[:rows].reshape(rows, -1).tolist()
    labels = [f"{i}: {t}" for i, t in enumerate(token_labels)]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("K", "V"), horizontal_spacing=0.04)
    for col, data in ((1, k2), (2, v2)):
        fig.add_trace(go.Heatmap(z=data, y=labels, colorscale="RdBu", zmid=0, showscale=col == 2,
                                 hovertemplate="slot %{y}<br>feature %{x}<br>%{z:.4f}<extra></extra>"),
                      row=1, col=col)
    fig.update_yaxes(autorange="reversed")
    # the slots' labels once, left of K: V's rows are the same slots (on a phone V's labels
    # lay over K's heatmap)
    fig.update_yaxes(showticklabels=False, row=1, col=2)
    fig.update_layout(title={"text": title, "font": {"size": 14}}, height=150 + 20 * max(rows, 4),
                      margin={"l": 10, "r": 10, "t": 60, "b": 10})
    return fig
