"""The main picture: "page tables -> physical blocks", a pure function of a snapshot.

    pool_figure(snap, events=(), decode=None, *, seq_labels=None, selected_seq=None,
                selected_block=None, block_level=False) -> go.Figure

- Block tables on top, one row per sequence (logical block j -> physical id, slots filled, then
  the pending token), the physical pool below: up to a few hundred blocks every block is drawn
  as its `block_size` slots with each slot's token text in it (viz/pool_layout.py decides),
  bigger pools as one cell per block. Lines join every table entry to its physical block. The
  CPU swap space is drawn, as a thin band under the pool, only when the engine has one; the
  prefix cache's CPU tier likewise, as a labelled band of slots under both.
- A hybrid model (KV cache groups, engine/core/kv_groups.py) gives each sequence a row per group
  ("seq 0 · full", "seq 0 · sliding 32"), kept together; an entry a sliding window dropped is an
  empty hatched cell with no link (viz/block_tables.py).
- The last step's `events` are overlaid and animated in the page (viz/overlays.py); the layout's
  `meta.anim` key changes only when the step does, so a redraw for a selection never replays
  the motion.
- `seq_labels` replaces a sequence's row label (e.g. a student's name in a classroom room);
  `selected_seq` / `selected_block` are outlined, the selected block's links drawn dark.
- Click contract (ui/motion.js): a cell of the trace named "pool" carries its block id in
  customdata[0]; a cell of "block tables" carries its sequence id in customdata[0].
- Composable: the traces come from small builders (pool_cells.pool_heatmap,
  block_tables.table_heatmap / links, overlays.change_overlays / rects) over a PoolLayout, so
  another figure (e.g. N tensor-parallel pools side by side) can place several pools itself.
- Speed: one Heatmap per pool, one for the tables, a few line traces; no per-cell shapes or
  annotations, and plotly's validation skipped (tests validate the JSON).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence

import plotly.graph_objects as go

from engine.core.events import Event
from engine.core.snapshot import SequenceView, Snapshot
from viz import palette
from viz.block_tables import TableRow, group_label, group_words, links, row_labels, table_rows, table_traces
from viz.draft_marks import draft_marks
from viz.overlays import change_overlays, rects, reserved_region
from viz.pool_cells import FAST, block_ids, pool_heatmap, tier_heatmap
from viz.pool_layout import PLOT_PX, SLOT_PX, cpu_layout, gpu_layout

ROW_PX = 25  # pixels per row of the picture (21 for tall pools)
PRESENTER_PLOT_PX = 760.0  # the plot's width in presenter mode on a 1280 x 720 projector
FONT = "'Source Sans 3', 'Source Sans Pro', system-ui, sans-serif"


def _legend(large: bool = False, extra: Sequence[str] = ()) -> list[str]:
    """The legend's lines: in presenter mode the colours on the first, the marks on the next;
    entries for what only some pictures show go after them, wrapped to the picture's width."""
    def swatch(colour: str, label: str, edge: str = "") -> str:
        return f"<span style='color:{edge or colour}'>■</span> {label}"
    owners = "".join(f"<span style='color:{c}'>■</span>" for c in palette.OWNERS[:4])
    parts = [
        f"{owners} owned by one sequence", swatch(palette.SHARED, "shared", "#c9b800"),
        swatch(palette.CACHED, "cached"), "□ free / empty slot", "▸ pending token",
        f"<span style='color:{palette.NEW}'>▭</span> new", "➜ copy-on-write",
        f"<span style='color:{palette.PREFIX_HIT}'>▭</span> prefix hit",
        f"<span style='color:{palette.EVICT}'>▭</span> evicted", *extra]
    budget = 95 if large else 150  # visible characters a line holds (12 px type; 16 px presenting)
    lines: list[list[str]] = [[]]
    for part in parts:
        if lines[-1] and _visible(lines[-1] + [part]) > budget:
            lines.append([])
        lines[-1].append(part)
    return [" · ".join(line) for line in lines]


def _visible(parts: Sequence[str]) -> int:
    """Characters that legend parts show, joined by " · " (their HTML tags take no room)."""
    return sum(len(re.sub("<[^>]*>", "", p)) + 3 for p in parts)


def _extras(events: Sequence[Event], dropped: bool) -> list[str]:
    """Legend entries for what this picture shows only at times."""
    kinds = {e.kind for e in events}
    out = []
    if dropped:  # some table has an entry a sliding window dropped
        out.append(f"<span style='color:{palette.HATCH}'>▨</span> dropped (left the window)")
    if "draft" in kinds:  # the step verified drafts (speculative decoding)
        out += [f"<span style='color:{palette.DRAFT}'>⬚</span> draft kept",
                f"<span style='color:{palette.REJECTED}'><s>abc</s></span> draft rejected"]
    if "offload" in kinds:
        out.append(f"<span style='color:{palette.OFFLOAD}'>⇣</span> offload to the CPU tier")
    if "load" in kinds:
        out.append(f"<span style='color:{palette.LOAD}'>⇡</span> load from the CPU tier")
    return out


def _held(seq: SequenceView) -> set[int]:
    """The blocks a sequence's tables hold, every group's (dropped entries are None)."""
    return {b for t in seq.block_tables.values() for b in t if b is not None}


def _pending_slots(rows: Sequence[TableRow], bs: int, token_text: Callable[[int], str]
                   ) -> dict[int, tuple[int, str]]:
    """block id -> (slot, text) of each pending token's slot: in the last block of the table of
    each of its sequence's groups (the token is written in every group)."""
    out = {}
    for r in rows:
        s = r.seq
        if s.pending_token is not None and s.status != "swapped" and s.num_tokens % bs and r.table:
            out[r.table[-1]] = (s.num_tokens % bs, token_text(s.pending_token))
    return out


def _groups_title(snap: Snapshot) -> str:
    """The title's words for a model with KV cache groups or a sliding window ("" for most)."""
    groups = snap.kv_cache_groups
    if len(groups) > 1:
        return " · groups: " + " + ".join(map(group_label, groups))
    return f" · sliding window: {groups[0].window} tokens" if groups[0].sliding else ""


def anim_key(snap: Snapshot, events: Sequence[Event]) -> str:
    """Changes when the picture shows another step: the page animates each key once."""
    changes = hash(tuple((e.kind, e.block_ids) for e in events)) & 0xFFFFFF
    return f"{snap.mode}:{snap.num_blocks}x{snap.block_size}:{snap.step}:{len(events)}:{changes:x}"


def pool_figure(snap: Snapshot, events: Sequence[Event] = (),
                decode: Callable[[list[int]], str] | None = None, *,
                seq_labels: Mapping[int, str] | None = None, selected_seq: int | None = None,
                selected_block: int | None = None, block_level: bool = False,
                large: bool = False, reserved: Collection[int] = ()) -> go.Figure:
    """The whole picture for one snapshot and the events of the step that led to it.
    `large`: presenter mode (type and rows 1.35x, for a projector). `reserved`: blocks held back
    from the sequences drawn (a classroom's shrunk pool): one hatched region, no table rows."""
    k = 1.35 if large else 1.0  # titles and labels
    kt = 1.8 if large else 1.0  # tokens and block ids: ~18 px on a projector
    plot_px = PRESENTER_PLOT_PX if large else PLOT_PX
    decode = decode or (lambda ids: " ".join(map(str, ids)))
    memo: dict[int, str] = {}

    def token_text(t: int) -> str:
        if t not in memo:
            memo[t] = decode([t])
        return memo[t]

    bs = snap.block_size
    keep = {b.block_id for b in snap.blocks if b.state != "free"}
    for e in events:  # the blocks the step changed (a swap's pairs: their GPU side)
        if e.kind == "swap_out":
            keep.update(e.block_ids[::2])
        elif e.kind == "swap_in":
            keep.update(e.block_ids[1::2])
        else:
            keep.update(e.block_ids)
    if selected_block is not None:
        keep.add(selected_block)
    gpu = gpu_layout(snap.num_blocks, bs, block_level, keep, plot_px, SLOT_PX * kt)
    cpu = cpu_layout(len(snap.cpu_blocks), bs, gpu) if snap.cpu_blocks else None
    tier = cpu_layout(len(snap.tier_blocks), bs, cpu or gpu) if snap.tier_blocks else None
    reserved = frozenset(reserved)
    seqs = [s for s in snap.sequences.values()
            if s.block_table and not (reserved and _held(s) <= reserved)]
    rows = table_rows(snap, seqs)
    pending = _pending_slots(rows, bs, token_text)
    top = 2.0 + len(rows) - 1  # first table row; the last sits 2 rows above the pool
    groups = snap.kv_cache_groups
    words = {g.name: group_words(g) for g in groups} if len(groups) > 1 or groups[0].sliding else None
    traces: list = [pool_heatmap(snap.blocks, gpu, token_text, pending, "pool", scale=kt,
                                 plot_px=plot_px, blank=reserved, groups=words)]
    marks = {g.name: "ˢ" for g in groups if g.sliding} if len(groups) > 1 else None
    ids = block_ids(snap.blocks, gpu, kt, reserved, marks)
    traces += [ids] if ids is not None else []
    if cpu is not None:
        traces.append(pool_heatmap(snap.cpu_blocks, cpu, token_text, {}, "cpu pool", "c", scale=k,
                                   plot_px=plot_px, groups=words))
    if tier is not None:
        traces.append(tier_heatmap(snap.tier_blocks, snap.tier_lru, tier, token_text, scale=k))
    entries: list[tuple] = []
    if rows:
        tables, entries = table_traces(snap, rows, top, gpu, cpu, token_text, k)
        traces += tables
    in_use = [b.block_id for b in snap.blocks if b.state == "used"]
    traces += change_overlays([e for e in events if not reserved.intersection(e.block_ids)], gpu,
                              cpu, in_use, tier)
    traces += draft_marks(events, snap, gpu, token_text, kt)
    traces += reserved_region(gpu, sorted(reserved))
    if selected_block is not None and 0 <= selected_block < snap.num_blocks:
        chosen = [e for e in entries if e[3] == selected_block and not e[4]]
        line = links(chosen, gpu, None, "selected links", palette.SELECT, 2.5)
        traces += ([line] if line is not None else []) + rects(gpu, [selected_block], "selected",
                                                               palette.SELECT, 3.5, pad=0.22)

    fig = go.Figure(traces, **FAST)
    drawn = selected_block is not None and 0 <= selected_block < snap.num_blocks
    notes, widest = row_labels(rows, top, k, seq_labels, selected_seq, selected_block if drawn else None)
    if rows:
        what = ("a block table per KV cache group: logical → physical block, slots filled"
                if len(groups) > 1 else "block tables: logical block → physical block, slots filled")
        notes.append(dict(x=0, y=top + 0.55, text=what,
                          xanchor="left", yanchor="bottom", showarrow=False,
                          font={"size": 12 * k, "color": palette.MUTED}))
    for row, first, last in gpu.folds:
        notes.append(dict(x=gpu.width / 2, y=gpu.y0 - row, showarrow=False,
                          text=f"blocks {first}–{last} free ({last - first + 1} blocks)",
                          font={"size": 12 * k, "color": palette.MUTED}))
    waiting = [s for s in snap.sequences.values() if not s.block_table]
    if waiting:  # a request added but not scheduled yet holds no block: say it is there
        names = " · ".join((seq_labels or {}).get(s.seq_id) or f"seq {s.seq_id}"
                           for s in waiting[:6])
        more = f" · +{len(waiting) - 6} more" if len(waiting) > 6 else ""
        notes.append(dict(x=0, y=top + (1.5 if seqs else 1.2), xanchor="left", yanchor="bottom",
                          showarrow=False, text=f"waiting, no blocks yet: {names}{more}",
                          font={"size": 12 * k, "color": palette.INK}))
    kind = "each block's slots with their tokens" if gpu.token_level else "one cell per block"
    if marks and gpu.token_level:  # a hybrid's two groups: whose K/V a block holds
        kind += " · ˢ: a sliding group's block"  # short: a projector's line ends at the pool's edge
    if reserved:
        kind += f" · hatched: {len(reserved)} blocks reserved by the teacher"
    notes.append(dict(x=0, y=0.55, text=f"GPU pool: {kind}", xanchor="left", yanchor="bottom",
                      showarrow=False, font={"size": 12 * k, "color": palette.MUTED}))
    bottom = -gpu.rows + 0.4
    if any(t.name == "freed label" for t in traces):  # it sits under the pool's last row
        bottom -= 0.7
    for band, name in ((cpu, "CPU swap space"),
                       (tier, "CPU tier of the prefix cache: evicted blocks kept by hash (LRU)")):
        if band is not None:
            notes.append(dict(x=0, y=band.y0 + 0.55, text=name, xanchor="left", yanchor="bottom",
                              showarrow=False, font={"size": 12 * k, "color": palette.MUTED}))
            bottom = band.y0 - band.rows + 0.4
    if len(entries) > 4000:
        notes.append(dict(x=gpu.width, y=top + 0.55, text=f"{len(entries)} table entries: links not drawn",
                          xanchor="right", yanchor="bottom", showarrow=False))
    mine = [i for i, r in enumerate(rows) if r.seq.seq_id == selected_seq]
    if mine:  # one outline around all the selected sequence's rows (they are kept together)
        lo, hi = top - mine[-1] - 0.5, top - mine[0] + 0.5
        fig.add_scatter(x=[-0.15, gpu.width + 0.15, gpu.width + 0.15, -0.15, -0.15],
                        y=[lo, lo, hi, hi, lo],
                        mode="lines", line={"color": palette.SELECT, "width": 1.5, "dash": "dot"},
                        name="selected sequence", hoverinfo="skip", showlegend=False)
    top += 1.0 if waiting else 0.0  # room for the waiting line
    span = top + 1.6 - bottom
    lines = _legend(large, _extras(events, any(t.name == "dropped entries" for t in traces)))
    groups_words = _groups_title(snap)
    if large and groups_words:  # a projector's title has no room for them: a line of their own
        lines = [groups_words.removeprefix(" · ")] + lines
        groups_words = ""
    legend = "<br>".join(lines)
    grown = 18 * k * max(0, len(lines) - (2 if large else 1))  # legend lines past the usual
    fig.update_layout(
        annotations=notes[:72],  # one label per sequence row, not per cell
        height=int(min(2000, max(320, (84 + (ROW_PX if span <= 30 else 21) * span) * k + grown))),
        margin={"l": max(78, 8 + 8 * widest) * k, "r": 8, "t": 72 * k + (24 if large else 0) + grown, "b": 8},
        font={"family": FONT, "color": palette.INK},
        paper_bgcolor="#ffffff", plot_bgcolor=palette.BORDER, showlegend=False,
        hoverlabel={"align": "left", "font": {"size": 13 * k}}, dragmode=False,
        meta={"anim": anim_key(snap, events)},
        title={"text": f"<b>engine step {snap.step}</b> · {snap.num_blocks} blocks × {bs} slots · {snap.mode}"
                       f"{groups_words}<br><span style='font-size:{12 * k:.0f}px'>{legend}</span>",
               "x": 0.01, "xanchor": "left", "yref": "container", "y": 1, "yanchor": "top",
               "pad": {"t": 12 * k}, "font": {"size": 16 * k}},
    )
    fig.update_xaxes(visible=False, fixedrange=True, range=[-0.3, gpu.width + 0.3])
    fig.update_yaxes(visible=False, fixedrange=True, range=[bottom - 0.2, top + 1.3])
    return fig
