"""A room's published view -> what the room pages show: the projector's picture (the main figure
with each student's request labelled), the scheduler's queues, the metrics, the requests table,
a student's own requests, and the QR code of the student link."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from classroom.records import RoomView
from engine.vllm.watch import CANNOT_SHOW
from viz import palette, pool_figure
from viz.vllm_watch import vllm_tree_figure

STATUS_COLOURS = {"waiting": "#8a8a8a", "running": "#1a9850", "preempted": "#d62728", "done": "#4c78a8"}


def projector_figure(view: RoomView, box: tuple[int, int] | None = None, large: bool = False) -> Any:
    """The room's picture, each request named by its student; fitted to the page's `box` for it,
    at presenter size (`large`) in the projector view."""
    if view.state.get("served_by") == "vllm":  # vLLM's cache, from its events: a tree, no pool
        return vllm_tree_figure(view.tree, box=box, large=large)
    if view.snapshot is None:
        return None
    return pool_figure(view.snapshot, view.events, view.decode, seq_labels=dict(view.seq_labels),
                       reserved=view.reserved, box=box, large=large)


def _badge(status: str, swapped: bool = False) -> str:
    text = "preempted (swapped to CPU)" if swapped else status
    return (f"<span style='background:{STATUS_COLOURS.get(status, '#888')};color:white;border-radius:4px;"
            f"padding:0 6px;font-size:0.9em'>{html.escape(text)}</span>")


def queues_html(view: RoomView) -> str:
    """The scheduler's three queues, first come first served, each request with its student."""
    state = view.state
    if not state:
        return ""
    by_id = {r["id"]: r for r in state["requests"]}
    rows = []
    for name in ("running", "waiting", "preempted"):
        ids = state["queues"][name]
        cells = " ".join(f"<span style='white-space:nowrap'>#{i} {html.escape(by_id[i]['student'])}</span>"
                         for i in ids[:40] if i in by_id)
        more = f" … +{len(ids) - 40}" if len(ids) > 40 else ""
        rows.append(f"<tr><td style='vertical-align:top;padding-right:8px'>{_badge(name)} {len(ids)}</td>"
                    f"<td>{cells or '<i>none</i>'}{more}</td></tr>")
    return f"<table id='room-queue-table'>{''.join(rows)}</table>"


def class_blocks(s: Mapping[str, Any]) -> str:
    """The class's blocks in use of those it may use; the teacher's reserve apart, so the parts
    add up to the pool."""
    held = s["reserved_blocks"]
    used = s["used_blocks"] - held  # the reserve's blocks are used blocks of the engine too
    if not held and s["usable_blocks"] == s["num_blocks"]:
        return f"{used} of {s['num_blocks']}"
    return (f"{used} of {s['usable_blocks']} · reserved by the teacher: {held} "
            f"(of the pool's {s['num_blocks']})")


def metrics_html(view: RoomView) -> str:
    s = view.state
    if not s:
        return ""
    if s.get("served_by") == "vllm":
        return vllm_metrics_html(s)
    done = sum(1 for r in s["requests"] if r["status"] == "done")
    ttft = sorted(r["time_to_first_token_s"] for r in s["requests"] if r["time_to_first_token_s"] is not None)
    median = f"{ttft[len(ttft) // 2]:.2f} s" if ttft else "-"
    state = "closed" if s["closed"] else "paused" if s["paused"] else "running"
    items = [
        ("room", f"<b style='font-size:1.4em;letter-spacing:2px'>{s['code']}</b> "
                 f"({state}, step {s['step']})"),
        ("students", s["students"]),
        ("requests", f"{len(s['requests'])} ({done} done)"),
        ("blocks used by the class", class_blocks(s)),
        ("cached / free", f"{s['cached_blocks']} / {s['free_blocks']}"),
        ("prefix-cache hits", f"{s['prefix_hit_blocks']} blocks"
         + ("" if s["prefix_caching"] else " (prefix caching off)")),
        ("preemptions", s["preemptions"]),
        ("copy-on-write / evictions", f"{s['cow_copies']} / {s['evictions']}"),
        ("median time to first token", median),
    ]
    rows = "".join(f"<tr><td style='color:#555;padding-right:8px'>{k}</td><td>{v}</td></tr>"
                   for k, v in items)
    error = f"<p style='color:#d62728'>{html.escape(s['error'])}</p>" if s["error"] else ""
    return f"<table id='room-metrics'>{rows}</table>{error}"


def requests_html(view: RoomView, limit: int = 80) -> str:
    """Every request of the room, newest first: student, status, its blocks, its text so far."""
    reqs = list(view.state.get("requests", ()))[::-1][:limit]
    if not reqs:
        return "<p><i>No requests yet: students open the link and press Send.</i></p>"
    rows = [_request_row(r) for r in reqs]
    return f"<div id='room-requests' style='max-height:420px;overflow-y:auto'>{''.join(rows)}</div>"


def _request_row(r: Mapping[str, Any], own: bool = False) -> str:
    blocks = ", ".join(map(str, r["blocks"])) or "-"
    extra = f" · preempted {r['preemptions']}×" if r["preemptions"] else ""
    who = "" if own else f"<b>{html.escape(r['student'])}</b> "
    prompt = f"<div style='color:#555'>{html.escape(r['prompt'])}</div>"
    return (f"<div class='room-request' style='border-bottom:1px solid #ddd;padding:4px 0'>"
            f"{who}#{r['id']} {_badge(r['status'], r['swapped'])} <span style='color:#555'>blocks "
            f"{blocks}{extra}</span>{prompt}<div>{html.escape(r['text']) or '<i>…</i>'}</div></div>")


def pool_strip_html(view: RoomView, blocks: set[int]) -> str:
    """The room's whole pool as a strip of small cells: this student's blocks in colour (gold
    where the class shares them, e.g. the system prompt's), the others' grey, free ones white."""
    snap = view.snapshot
    if snap is None or snap.num_blocks > 1024:
        return ""
    cells = []
    for blk in snap.blocks:
        if blk.block_id in blocks:
            colour = palette.SHARED if blk.ref_count > 1 else palette.OWNERS[0]
        else:
            colour = "#666" if blk.ref_count else "#d8d8d8" if blk.state == "cached" else "#fff"
        cells.append(f"<span title='block {blk.block_id}' style='display:inline-block;width:9px;"
                     f"height:9px;margin:1px;background:{colour};border:1px solid #bbb'></span>")
    return (f"<div id='student-pool' style='line-height:8px;margin:6px 0'>{''.join(cells)}</div>"
            "<div style='font-size:0.8em;color:#555'>the room's pool: <b style='color:"
            f"{palette.OWNERS[0]}'>your blocks</b>, <b style='color:#c08a00'>yours, shared with the "
            "class</b>, dark grey: the others', light grey: cached</div>")


def student_html(view: RoomView, mine: list[int], cleared: bool) -> str:
    """A student's own requests, newest first, with where each one is, and their blocks in the
    room's pool."""
    by_id = {r["id"]: r for r in view.state.get("requests", ())}
    parts = []
    if mine:  # the pool as it is now, with the blocks this student's requests hold (none when done)
        parts.append(pool_strip_html(view, {b for i in mine if i in by_id for b in by_id[i]["blocks"]}))
    if cleared:
        parts.append("<p><i>The teacher cleared the room: your earlier requests are gone. "
                     "Send again!</i></p>")
    for i in reversed(mine):
        if i in by_id:
            parts.append(_request_row(by_id[i], own=True))
    if view.state.get("paused"):
        parts.insert(0, "<p><b>The teacher paused the engine.</b> Your request waits.</p>")
    if view.state.get("closed"):
        parts.insert(0, "<p><b>This room is closed.</b></p>")
    return f"<div id='room-mine'>{''.join(parts) or '<i>Type a prompt and press Send.</i>'}</div>"


def qr_svg(url: str) -> str:
    """The student link as a QR code (inline SVG), or nothing if segno is not installed."""
    try:
        import segno
    except ImportError:
        return ""
    return segno.make(url, error="m").svg_inline(scale=4)


def vllm_metrics_html(s: Mapping[str, Any]) -> str:
    """A room served by vLLM: its code, who answers, what vLLM's events told, and what they
    cannot tell (classroom/vllm_room.py)."""
    done = sum(1 for r in s["requests"] if r["status"] == "done")
    items = [
        ("room", f"<b style='font-size:1.4em;letter-spacing:2px'>{s['code']}</b> "
                 f"({'closed' if s['closed'] else 'open'}, served by vLLM at "
                 f"{html.escape(s['vllm'])})"),
        ("students", s["students"]),
        ("requests", f"{len(s['requests'])} ({done} done)"),
        ("blocks in vLLM's prefix cache", s["vllm_blocks"]),
        ("stored / removed since the room opened", f"{s['vllm_stored']} / {s['vllm_removed']}"),
        ("vLLM's last message", s["step"]),
    ]
    rows = "".join(f"<tr><td style='color:#555;padding-right:8px'>{k}</td><td>{v}</td></tr>"
                   for k, v in items)
    said = "".join(f"<p style='color:#d62728'>{html.escape(p)}</p>" for p in s["problems"][-1:])
    return (f"<table id='room-metrics'>{rows}</table>{said}"
            f"<p style='color:#555'>{html.escape(CANNOT_SHOW)}</p>")
