"""The main picture: "page tables -> physical blocks".

Block tables on top (a row per sequence, each logical block a cell labelled with its physical id
and fill), the physical pool below as one Heatmap (colour = owner, shared = its own colour,
cached = grey, free = white), lines from every logical cell to its physical block, the CPU swap
pool beside the GPU pool, and the last step's events overlaid: new blocks outlined green,
copy-on-write as an arrow source -> copy, prefix hits outlined gold, evictions marked red.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import plotly.graph_objects as go

from engine.events import Event
from engine.snapshot import BlockView, Snapshot
from viz import palette

# plotly validates every value of every list on construction: 3/4 of the build time of a 4096-block
# figure. The traces here are fixed in code, so skip it (tests/test_viz.py validates the output).
_FAST = {"_validate": False}
MAX_LINKS = 4000  # beyond this many table->block lines the picture is a grey blur: skip them
MAX_TEXT_BLOCKS = 512  # ref counts printed in cells up to this pool size

# categories of the discrete colour scale
_FREE, _CACHED, _SHARED, _OWNER0 = 0, 1, 2, 3
_COLOURS = [palette.FREE, palette.CACHED, palette.SHARED, *palette.OWNERS]


def _colourscale() -> list[list]:
    n = len(_COLOURS)
    scale = []
    for i, c in enumerate(_COLOURS):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale


def pool_width(num_blocks: int) -> int:
    return 16 if num_blocks <= 256 else 32 if num_blocks <= 1024 else 64


def _category(block: BlockView) -> int:
    if block.ref_count > 1:
        return _SHARED
    if block.ref_count == 1:
        return _OWNER0 + block.owners[0] % len(palette.OWNERS)
    return _CACHED if block.state == "cached" else _FREE


def _grid(blocks: Sequence[BlockView], width: int, x0: float, decode: Callable, prefix: str
          ) -> tuple[go.Heatmap, dict[int, tuple[float, float]]]:
    rows = -(-len(blocks) // width) if blocks else 0
    z = [[None] * width for _ in range(rows)]
    text = [[""] * width for _ in range(rows)]
    custom = [[None] * width for _ in range(rows)]
    where: dict[int, tuple[float, float]] = {}
    show_refs = len(blocks) <= MAX_TEXT_BLOCKS
    for blk in blocks:
        r, c = divmod(blk.block_id, width)
        z[r][c] = _category(blk)
        if show_refs and blk.ref_count:
            text[r][c] = str(blk.ref_count)
        custom[r][c] = [
            f"{prefix}{blk.block_id}", blk.state, blk.ref_count,
            ", ".join(f"seq {o}" for o in blk.owners) or "-",
            blk.num_filled, "-" if blk.block_hash is None else f"{blk.block_hash & 0xFFFFFFFF:08x}",
            _shorten(decode(list(blk.token_ids))) if blk.token_ids else "",
        ]
        where[blk.block_id] = (x0 + c, -r)
    heat = go.Heatmap(**_FAST,
        z=z, x=[x0 + c for c in range(width)], y=[-r for r in range(rows)], text=text,
        texttemplate="%{text}", customdata=custom, zmin=-0.5, zmax=len(_COLOURS) - 0.5,
        colorscale=_colourscale(), showscale=False, xgap=2, ygap=2, name=f"{prefix}pool",
        hovertemplate=("<b>block %{customdata[0]}</b> (%{customdata[1]})<br>ref count %{customdata[2]}"
                       "<br>owners %{customdata[3]}<br>filled %{customdata[4]} slots"
                       "<br>hash %{customdata[5]}<br>tokens: %{customdata[6]}<extra></extra>"),
    )
    return heat, where


def _shorten(s: str, n: int = 60) -> str:
    s = s.replace("<", "&lt;").replace("\n", "⏎")
    return s if len(s) <= n else s[: n - 1] + "…"


def pool_figure(snap: Snapshot, events: Sequence[Event] = (),
                decode: Callable[[list[int]], str] | None = None) -> go.Figure:
    """The whole picture for one snapshot and the events of the step that led to it."""
    decode = decode or (lambda ids: " ".join(map(str, ids)))
    width = pool_width(snap.num_blocks)
    gpu_heat, gpu_at = _grid(snap.blocks, width, 0, decode, "")
    traces: list = [gpu_heat]
    cpu_at: dict[int, tuple[float, float]] = {}
    if snap.cpu_blocks:
        cpu_width = pool_width(len(snap.cpu_blocks))
        cpu_heat, cpu_at = _grid(snap.cpu_blocks, cpu_width, width + 2, decode, "cpu ")
        traces.append(cpu_heat)

    seqs = [s for s in snap.sequences.values() if s.block_table]
    top = 1.5 + len(seqs)  # tables sit above the pool, first sequence on top
    tx, ty, tz, ttext, tcustom = [], [], [], [], []
    lx: list = []
    ly: list = []
    n_links = sum(len(s.block_table) for s in seqs)
    for r, seq in enumerate(seqs):
        y = top - r
        swapped = seq.status == "swapped"
        where = cpu_at if swapped else gpu_at
        pool = snap.cpu_blocks if swapped else snap.blocks
        for j, b in enumerate(seq.block_table):
            tx.append(j)
            ty.append(y)
            tz.append(_OWNER0 + seq.seq_id % len(palette.OWNERS))
            ttext.append(f"{'c' if swapped else ''}{b}")
            tcustom.append([seq.seq_id, j, f"{'cpu ' if swapped else ''}{b}", pool[b].num_filled,
                            snap.block_size])
            if n_links <= MAX_LINKS and b in where:
                px, py = where[b]
                lx += [j, px, None]
                ly += [y - 0.45, py + 0.45, None]
    if tx:
        traces.append(go.Scatter(**_FAST,
            x=lx, y=ly, mode="lines", line={"color": "rgba(120,120,120,0.35)", "width": 1},
            hoverinfo="skip", name="block table links", showlegend=False))
        traces.append(go.Scatter(**_FAST,
            x=tx, y=ty, mode="markers+text", text=ttext, textfont={"color": "white", "size": 11},
            marker={"symbol": "square", "size": 22, "color": [_COLOURS[z] for z in tz],
                    "line": {"color": "#333", "width": 1}},
            customdata=tcustom, name="block tables", showlegend=False,
            hovertemplate=("seq %{customdata[0]}, logical block %{customdata[1]}<br>→ physical block "
                           "%{customdata[2]} (%{customdata[3]}/%{customdata[4]} filled)<extra></extra>")))
    traces += _event_overlays(events, gpu_at, cpu_at)

    fig = go.Figure(traces, **_FAST)
    labels = [dict(x=-0.8, y=top - r, text=f"seq {s.seq_id}", xanchor="right", showarrow=False,
                   font={"color": palette.owner_colour(s.seq_id)}) for r, s in enumerate(seqs)]
    labels.append(dict(x=-0.5, y=0.75, text="GPU pool", xanchor="left", yanchor="bottom",
                       showarrow=False, font={"size": 11, "color": "#555"}))
    if snap.cpu_blocks:
        labels.append(dict(x=width + 1.5, y=0.75, text="CPU swap space", xanchor="left",
                           yanchor="bottom", showarrow=False, font={"size": 11, "color": "#555"}))
    if n_links > MAX_LINKS:
        labels.append(dict(x=0, y=top + 1, text=f"{n_links} table entries: links not drawn",
                           showarrow=False, xanchor="left"))
    rows = -(-snap.num_blocks // width)
    fig.update_layout(
        annotations=labels[:64],  # one label per sequence row, not per cell
        height=int(min(1400, 240 + 22 * (rows + len(seqs)))),
        margin={"l": 70, "r": 10, "t": 30, "b": 10},
        plot_bgcolor="#d0d0d0", showlegend=False, hoverlabel={"align": "left"},  # gaps = borders
        title={"text": f"step {snap.step} · {snap.num_blocks} blocks of {snap.block_size} slots"
                       f" · {snap.mode}", "x": 0.01, "font": {"size": 13}},
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, scaleanchor="x", scaleratio=1)
    return fig


def _event_overlays(events: Sequence[Event], gpu_at: dict, cpu_at: dict) -> list:
    def markers(ids, symbol, colour, name, size=24):
        pts = [gpu_at[b] for b in ids if b in gpu_at]
        if not pts:
            return []
        return [go.Scatter(**_FAST, x=[p[0] for p in pts], y=[p[1] for p in pts], mode="markers", name=name,
                           marker={"symbol": symbol, "size": size, "color": colour,
                                   "line": {"color": colour, "width": 3}},
                           hoverinfo="name", showlegend=False)]

    new, hits, evicted, cow_pairs, swaps = [], [], [], [], []
    for e in events:
        if e.kind == "allocate":
            new += e.block_ids
        elif e.kind == "prefix_hit":
            hits += e.block_ids
        elif e.kind == "evict":
            evicted += e.block_ids
        elif e.kind == "cow":
            cow_pairs.append(e.block_ids)
            new.append(e.block_ids[1])
        elif e.kind in ("swap_out", "swap_in"):
            ids = e.block_ids
            for a, b in zip(ids[::2], ids[1::2], strict=True):
                gpu, cpu = (a, b) if e.kind == "swap_out" else (b, a)
                if gpu in gpu_at and cpu in cpu_at:
                    swaps.append((gpu_at[gpu], cpu_at[cpu]))
    out = markers(new, "square-open", palette.NEW, "new block")
    out += markers(hits, "square-open", palette.PREFIX_HIT, "prefix hit", 28)
    out += markers(evicted, "x-thin-open", palette.EVICT, "evicted", 18)
    if cow_pairs:
        xs, ys = [], []
        for src, dst in cow_pairs:
            if src in gpu_at and dst in gpu_at:
                (x0, y0), (x1, y1) = gpu_at[src], gpu_at[dst]
                xs += [x0, x1, None]
                ys += [y0, y1, None]
        out.append(go.Scatter(**_FAST, x=xs, y=ys, mode="lines+markers", name="copy-on-write",
                              line={"color": palette.COW, "width": 3},
                              marker={"symbol": "arrow", "size": 14, "angleref": "previous",
                                      "color": palette.COW},
                              hoverinfo="name", showlegend=False))
    if swaps:
        xs, ys = [], []
        for (x0, y0), (x1, y1) in swaps:
            xs += [x0, x1, None]
            ys += [y0, y1, None]
        out.append(go.Scatter(**_FAST, x=xs, y=ys, mode="lines", name="swap",
                              line={"color": palette.SWAP, "width": 2, "dash": "dot"},
                              hoverinfo="name", showlegend=False))
    return out
