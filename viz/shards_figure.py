"""Tensor parallelism's picture: one block table on top, N pools side by side below.

Every rank's pool has the same block ids in the same state (the one KV cache manager decided
them); what differs is which heads' K/V each rank keeps in those blocks, and so the bytes. The
figure draws the block tables once (they live in the scheduler, not on any GPU; a hybrid model's
sequence has a row per KV cache group, an entry its sliding window dropped drawn empty), then
each rank's pool as a grid of the same blocks, titled with its heads and the bytes it holds.

A pure function of a snapshot and the engine's tensor-parallel numbers (engine_info()).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from engine.describe.snapshot import Snapshot
from engine.describe.units import human_bytes
from viz import palette
from viz.block_tables import table_rows

_FAST = {"_validate": False}  # fixed traces; tests/viz/test_shards_figure.py validates the output


def _colour(ref_count: int, state: str, owners: tuple[int, ...]) -> str:
    if ref_count > 1:
        return palette.SHARED
    if ref_count == 1:
        return palette.owner_colour(owners[0])
    return palette.CACHED if state == "cached" else palette.FREE


def _heads(rank: int, per_rank: int) -> str:
    first, last = rank * per_rank, (rank + 1) * per_rank - 1
    return f"KV head {first}" if first == last else f"KV heads {first}..{last}"


def shards_figure(snap: Snapshot, info: Mapping[str, Any]) -> go.Figure:
    """The shards of a tensor-parallel engine. `info` is its engine_info(): the figure reads
    tensor_parallel_size, kv_bytes_per_rank, kv heads (per rank) and the per-block bytes."""
    n = int(info.get("tensor_parallel_size", 1))
    per_rank = list(info.get("kv_bytes_per_rank") or [0] * n)
    heads = int(info.get("kv heads per rank", info.get("kv heads", n) // n or 1))
    block_bytes = int(info.get("kv bytes per block per rank", info.get("kv bytes per block", 0)))
    width = 8 if snap.num_blocks <= 64 else 16 if snap.num_blocks <= 512 else 32
    pool_rows = -(-snap.num_blocks // width)
    gap = 2
    colours = [_colour(b.ref_count, b.state, b.owners) for b in snap.blocks]
    weights = info.get("weight bytes per rank")
    weights_note = f" · {human_bytes(weights)} of weights" if weights else ""
    traces: list[Any] = []
    notes: list[dict[str, Any]] = []
    for r in range(n):
        x0 = r * (width + gap)
        xs = [x0 + b.block_id % width for b in snap.blocks]
        ys = [-(b.block_id // width) for b in snap.blocks]
        mine = _heads(r, heads)
        hover = [f"rank {r}, block {b.block_id}: {b.state}, ref count {b.ref_count}"
                 f"<br>owners {list(b.owners)}, {b.num_filled} slots filled"
                 f"<br>{mine} only: {human_bytes(block_bytes)}" for b in snap.blocks]
        traces.append(go.Scatter(
            x=xs, y=ys, mode="markers+text", text=[str(b.block_id) for b in snap.blocks],
            textfont={"size": 9}, hovertext=hover, hoverinfo="text", showlegend=False,
            marker={"symbol": "square", "size": 22, "color": colours,
                    "line": {"width": 1, "color": "#606060"}},
            name=f"rank {r}", **_FAST))
        notes.append({"x": x0 + (width - 1) / 2, "y": 1.2, "showarrow": False,
                      "text": f"<b>rank {r}</b>: {mine}<br>"
                              f"{human_bytes(per_rank[r] if r < len(per_rank) else 0)} of KV"
                              f"{weights_note}"})
    # the block tables: once, above all pools, because one manager keeps them for every rank
    seqs = sorted(snap.sequences.values(), key=lambda s: s.seq_id)
    rows = table_rows(snap, seqs)
    tx, ty, ttext, tcol, thover = [], [], [], [], []
    for i, row in enumerate(rows):
        sid, y = row.seq.seq_id, 3 + len(rows) - i
        notes.append({"x": -0.6, "y": y, "xanchor": "right", "showarrow": False,
                      "text": f"seq {sid}" + (f" · {row.label}" if row.label else "")})
        for j, block in enumerate(row.table):
            tx.append(j)
            ty.append(y)
            ttext.append("—" if block is None else str(block))
            tcol.append(palette.DROPPED if block is None else palette.owner_colour(sid))
            thover.append(f"seq {sid}, logical block {j}: dropped by the {row.group.window}-token window"
                          if block is None else
                          f"seq {sid}, logical block {j} → physical block {block} on every rank")
    traces.append(go.Scatter(
        x=tx, y=ty, mode="markers+text", text=ttext,
        textfont={"size": 9, "color": [palette.MUTED if t == "—" else "white" for t in ttext]},
        hovertext=thover, hoverinfo="text", showlegend=False, name="block tables",
        marker={"symbol": "square", "size": 22, "color": tcol}, **_FAST))
    per_group = " and KV cache group" if len(snap.kv_cache_groups) > 1 else ""
    notes.append({"x": -2, "y": 4 + len(rows), "xanchor": "left", "showarrow": False,
                  "text": f"<b>one block table per sequence{per_group}</b> (in the scheduler; sent to "
                          f"all {n} ranks every step)" if seqs else "<b>no sequences yet</b>"})
    fig = go.Figure(traces, **_FAST)
    fig.update_layout(
        title={"text": f"Tensor parallelism: one block table, {n} pools with the same block ids",
               "y": 0.98, "x": 0.5, "xanchor": "center"},  # the app's plot label sits top left
        annotations=notes, plot_bgcolor="white", height=260 + 24 * (pool_rows + len(rows)),
        margin={"l": 10, "r": 10, "t": 60, "b": 10},
        xaxis={"visible": False, "range": [-2.5, n * (width + gap) - gap]},
        yaxis={"visible": False, "range": [-pool_rows - 0.5, 5 + len(rows)]})
    return fig
