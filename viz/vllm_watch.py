"""The watch view of a real vLLM (engine/vllm/): its prefix cache drawn with PagedLab's own tree
figure, a timeline of the blocks it stored and removed, its counts, and what events cannot show.
Pure functions of what `VllmWatch` returns (its tree, timeline and counts); no Gradio.

    vllm_tree_figure(tree, new=(), removed=(), before=None, decode=None, *, box=None, large=False)
    vllm_timeline_figure(timeline, *, box=None, large=False)
    vllm_counts_html(counts, status="")
    vllm_events_markdown(events, decode=None)
"""

from __future__ import annotations

import html
from collections.abc import Callable, Collection, Sequence

import plotly.graph_objects as go

from engine.describe.prefix_tree import PrefixTree
from engine.vllm.mirror import BatchMark, WatchCounts
from engine.vllm.schema import VllmEvent
from engine.vllm.watch import CANNOT_SHOW
from viz import palette
from viz.pool_cells import FAST
from viz.prefix_tree_figure import prefix_tree_figure
from viz.view_frame import base_layout, note_figure, view_sizes

TREE_TITLE = "vLLM's cache, from its events"  # short: a phone's picture is 360 px wide
TIMELINE_TITLE = "Blocks vLLM stored and removed"
#: the most bars the timeline draws: past it, messages share a bar by time
MAX_BARS = 120


def vllm_tree_figure(tree: PrefixTree, new: Collection[int] = (), removed: Collection[int] = (),
                     before: PrefixTree | None = None,
                     decode: Callable[[list[int]], str] | None = None, *,
                     box: tuple[float, float] | None = None, large: bool = False) -> go.Figure:
    """vLLM's cache as PagedLab's prefix tree: the hashes stored since the last redraw (`new`)
    outlined, those removed (`removed`, drawn where they were in `before`) as ghosts."""
    if not tree.nodes and not removed:
        return note_figure(TREE_TITLE, "No block in vLLM's prefix cache yet: send it a request.",
                           box, large)
    return prefix_tree_figure(tree, decode=decode, before=before, box=box, large=large,
                              title=TREE_TITLE,
                              hash_marks={"new hash": new, "evicted": removed})


def vllm_timeline_figure(timeline: Sequence[BatchMark], *, box: tuple[float, float] | None = None,
                         large: bool = False) -> go.Figure:
    """Blocks stored (up) and removed (down) over vLLM's time, one bar per message or, for long
    watches, per slice of time; a reset of the whole cache is a dashed line."""
    if not timeline:
        return note_figure(TIMELINE_TITLE, "No KV event yet.", box, large)
    sz = view_sizes(box, large)
    t0 = timeline[0].ts
    bars = _bins(timeline, t0)
    xs = [b[0] for b in bars]
    width = max((xs[-1] - xs[0]) / max(len(xs), 1) * 0.8, 1e-3)
    traces = [
        go.Bar(**FAST, x=xs, y=[b[1] for b in bars], name="stored", width=width,
               marker={"color": palette.NEW}, hovertemplate="%{y} stored at %{x:.2f} s<extra></extra>"),
        go.Bar(**FAST, x=xs, y=[-b[2] for b in bars], name="removed (evicted)", width=width,
               marker={"color": palette.EVICT},
               hovertemplate="%{customdata} removed at %{x:.2f} s<extra></extra>",
               customdata=[b[2] for b in bars]),
    ]
    height = sz.height or int(sz.title * 2.4 + sz.font * 16)
    fig = go.Figure(traces, **FAST)
    fig.update_layout(**base_layout(sz, TIMELINE_TITLE, height, sz.font * 4,
                                    {"view": "vllm-timeline", "bars": len(bars)}),
                      barmode="relative", showlegend=True, shapes=[
                          {"type": "line", "x0": m.ts - t0, "x1": m.ts - t0, "yref": "paper",
                           "y0": 0, "y1": 1, "line": {"color": palette.MUTED, "dash": "dash"}}
                          for m in timeline if m.cleared][:50])
    fig.update_xaxes(title_text="seconds since the first event", fixedrange=True)
    fig.update_yaxes(title_text="blocks", fixedrange=True, zeroline=True,
                     zerolinecolor=palette.MUTED)
    return fig


def _bins(timeline: Sequence[BatchMark], t0: float) -> list[tuple[float, int, int]]:
    """(time, stored, removed) per bar: a message each, or MAX_BARS slices of the time."""
    if len(timeline) <= MAX_BARS:
        return [(m.ts - t0, m.stored, m.removed) for m in timeline]
    span = max(timeline[-1].ts - t0, 1e-9)
    sums = [[0, 0] for _ in range(MAX_BARS)]
    for m in timeline:
        i = min(int((m.ts - t0) / span * MAX_BARS), MAX_BARS - 1)
        sums[i][0] += m.stored
        sums[i][1] += m.removed
    return [((i + 0.5) * span / MAX_BARS, s, r) for i, (s, r) in enumerate(sums) if s or r]


def vllm_counts_html(counts: WatchCounts, status: str = "") -> str:
    """The watch's numbers, then what events cannot show."""
    rows = [
        ("blocks in vLLM's prefix cache", f"{counts.blocks} ({counts.copies} physical copies)"),
        ("stored / removed since the watch began", f"{counts.stored} / {counts.removed}"),
        ("whole-cache resets", counts.cleared),
        ("messages / events read", f"{counts.batches} / {counts.events}"),
    ]
    if counts.other_medium:
        rows.append(("in vLLM's offloading tiers (not drawn)", counts.other_medium))
    if counts.unknown_removed:
        rows.append(("removed before the watch saw them stored", counts.unknown_removed))
    body = "".join(f"<tr><td>{html.escape(k)}</td><td><b>{html.escape(str(v))}</b></td></tr>"
                   for k, v in rows)
    head = f"<p>{html.escape(status)}</p>" if status else ""
    return (f"{head}<table style='font-size:13px;width:100%'>{body}</table>"
            f"<p style='color:{palette.MUTED}'>{html.escape(CANNOT_SHOW)}</p>")


def vllm_events_markdown(events: Sequence[VllmEvent], decode: Callable[[list[int]], str] | None = None,
                         ) -> str:
    """The events that came last, newest first, a line each: what vLLM stored (hashes, the
    parent it chains from, the tokens), removed or cleared, and in which of its messages."""
    if not events:
        return "_No KV event yet: send vLLM a prompt._"
    lines = []
    for e in events:
        hashes = ", ".join(f"`{h & 0xFFFFFFFF:08x}`" for h in e.block_hashes[:4])
        more = f" +{len(e.block_hashes) - 4}" if len(e.block_hashes) > 4 else ""
        n = len(e.block_hashes)
        blocks = f"{n} block{'s' if n != 1 else ''}"
        if e.kind == "stored":
            after = "a prompt's start" if e.parent_hash is None else f"`{e.parent_hash & 0xFFFFFFFF:08x}`"
            text = decode(list(e.token_ids[:e.block_size])) if decode and e.token_ids else ""
            said = f": “{html.escape(text[:48].replace(chr(10), ' '), quote=False)}…”" if text else ""
            lines.append(f"- `stored` {blocks} {hashes}{more} after {after}{said}")
        elif e.kind == "removed":
            lines.append(f"- `removed` {blocks} {hashes}{more} (evicted)")
        else:
            lines.append("- `cleared` the whole prefix cache (a reset)")
    first, last = events[-1].seq, events[0].seq
    where = f"vLLM's message {first}" if first == last else f"vLLM's messages {first}–{last}"
    return f"**{where}** (newest first)\n\n" + "\n".join(lines)
