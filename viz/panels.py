"""The panels beside the main picture: the narrated event log, each sequence's text with its
tokens coloured by the block that holds them, and the live metrics. A hybrid model's token names
its block in each KV cache group; a token whose block every group dropped (an all-sliding model
past its window) is greyed."""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine.core.events import Event
from engine.describe.baselines import naive_blocks_for
from engine.describe.narration import narrate, plural
from engine.describe.snapshot import Snapshot
from engine.describe.units import human_bytes
from viz import palette

MAX_TOKENS_SHOWN = 400  # per sequence; the start is elided beyond that

def event_log_markdown(events: Sequence[Event], limit: int = 60,
                       empty: str = "No events yet: start a sequence.") -> str:
    """The last step's events, one narrated line each (`empty` when there are none)."""
    if not events:
        return f"_{empty}_"
    lines = [f"- `{e.kind}` {html.escape(narrate(e), quote=False)}" for e in events[:limit]]
    if len(events) > limit:
        lines.append(f"- … and {len(events) - limit} more events")
    first, last = events[0].step, events[-1].step
    steps = f"Engine step {first}" if first == last else f"Engine steps {first}–{last}"
    return f"**{steps}**\n\n" + "\n".join(lines)


def sequences_html(snap: Snapshot, token_text: Callable[[int], str]) -> str:
    """Each sequence's tokens, each on the colour of its logical block; the pending token apart."""
    if not snap.sequences:
        return "<p><i>No sequences.</i></p>"
    parts = []
    bs = snap.block_size
    for seq in snap.sequences.values():
        colour = palette.owner_colour(seq.seq_id)
        spans = []
        start = max(0, seq.num_tokens - MAX_TOKENS_SHOWN)
        if start:
            spans.append(f"<span style='color:#888'>… {start} tokens …</span>")
        tables = seq.block_tables
        for i in range(start, seq.num_tokens):
            j, slot = divmod(i, bs)
            where, gone = _where(snap, tables, j)
            shade = "rgba(76,120,168,0.18)" if j % 2 == 0 else "rgba(84,162,75,0.22)"
            shade = "rgba(150,150,150,0.10);color:#888" if gone else shade
            spans.append(f"<span title='logical block {j}{where}, slot {slot}' "
                         f"style='background:{shade};border-radius:3px;white-space:pre-wrap'>"
                         f"{html.escape(token_text(seq.token_ids[i]))}</span>")
        if seq.pending_token is not None:
            spans.append(f"<span title='pending: sampled, not yet in a slot' style='border:1px dashed "
                         f"{colour};border-radius:3px;white-space:pre-wrap'>"
                         f"{html.escape(token_text(seq.pending_token))}</span>")
        cached = f", {seq.num_cached_tokens} from the prefix cache" if seq.num_cached_tokens else ""
        parts.append(
            f"<div style='margin:4px 0'><b style='color:{colour}'>seq {seq.seq_id}</b> "
            f"<small>({seq.status}, {plural(seq.num_tokens, 'token')} in "
            f"{_blocks_words(snap, tables)}{cached})"
            f"</small><div style='font-family:monospace;font-size:13px;line-height:1.6'>"
            f"{''.join(spans)}</div></div>")
    return "".join(parts)


def _where(snap: Snapshot, tables: Mapping[str, Sequence[int | None]], j: int) -> tuple[str, bool]:
    """What follows "logical block j" in a token's title (" → physical 12"; a hybrid's names
    each group's block) and whether every group dropped it."""
    windows = {g.name: g.window for g in snap.kv_cache_groups}
    said = []
    for name, table in tables.items():
        b = table[j] if j < len(table) else "?"
        gone = f"dropped (left the {windows.get(name)}-token window)"
        if len(tables) == 1:
            said.append(f": {gone}" if b is None else f" → physical {b}")
        else:
            said.append(f"{name}: {gone}" if b is None else f"{name} → physical {b}")
    dropped = all(j < len(t) and t[j] is None for t in tables.values())
    return (said[0] if len(said) == 1 else ": " + " · ".join(said)), dropped


def _blocks_words(snap: Snapshot, tables: Mapping[str, Sequence[int | None]]) -> str:
    """"3 blocks", or with a sliding window what each group holds and what it dropped."""
    n = max((len(t) for t in tables.values()), default=0)
    dropped = {name: t.count(None) for name, t in tables.items()}
    if len(tables) == 1:
        (name, gone), = dropped.items()
        return plural(n - gone, "block") + (f", {gone} dropped by the window" if gone else "")
    held = ", ".join(f"{name} {len(tables[name]) - gone}" + (f" ({gone} dropped)" if gone else "")
                     for name, gone in dropped.items())
    return f"{plural(n, 'logical block')} · blocks held: {held}"


def metrics_html(snap: Snapshot, info: Mapping[str, Any], max_len: int) -> str:
    """Live numbers, all read from the snapshot and the engine's description."""
    m = snap.metrics
    naive = naive_blocks_for(snap, max_len, "max")
    live = [s for s in snap.sequences.values() if s.block_table]
    prompt = sum(s.prompt_len for s in live)
    # a sequence resumed after preemption may also find its generated tokens cached: count prompts
    hit_rate = sum(min(s.num_cached_tokens, s.prompt_len) for s in live) / prompt if prompt else 0.0
    per_block = info.get("kv bytes per block")
    rows = [
        ("blocks used", f"{m.used_blocks} of {snap.num_blocks}"),
        ("contiguous reservation would hold",
         f"{plural(naive, 'block')} (each sequence reserves {plural(max_len, 'slot')})"),
        ("saved by sharing",
         f"{plural(m.shared_saving, 'block')} ({m.sharing_saving_fraction:.0%} of table entries)"),
        ("prefix hit rate (live prompts)", f"{hit_rate:.0%}"),
        ("copy-on-write copies", m.cow_copies),
        ("evictions", m.evictions),
        ("cached / free blocks", f"{m.cached_blocks} / {m.free_blocks}"),
    ]
    if per_block:
        rows.append(("KV bytes in use", human_bytes(m.used_blocks * per_block)))
    if m.dropped_blocks or any(g.sliding for g in snap.kv_cache_groups):
        rows.append(("dropped by sliding windows", plural(m.dropped_blocks, "block")))
    if snap.tier_blocks:  # the prefix cache's CPU tier
        held = sum(b.state == "cached" for b in snap.tier_blocks)
        rows.append(("CPU tier slots holding cached blocks", f"{held} of {len(snap.tier_blocks)}"))
        rows.append(("offloaded to / loaded back from the CPU tier",
                     f"{plural(m.offloaded_blocks, 'block')} / {m.offload_hit_blocks}"))
    for key in ("requests_running", "requests_waiting", "requests_swapped", "preemptions"):
        if m.extra.get(key):
            rows.append((key.replace("_", " "), m.extra[key]))
    body = "".join(f"<tr><td>{html.escape(k)}</td><td><b>{html.escape(str(v))}</b></td></tr>"
                   for k, v in rows)
    return f"<table style='font-size:13px;width:100%'>{body}</table>"
