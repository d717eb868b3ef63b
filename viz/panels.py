"""The panels beside the main picture: the narrated event log, each sequence's text with its
tokens coloured by the block that holds them, and the live metrics."""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine.core.baselines import naive_blocks_for
from engine.core.events import Event
from engine.core.narration import plural
from engine.core.snapshot import Snapshot
from engine.core.units import human_bytes
from viz import palette

MAX_TOKENS_SHOWN = 400  # per sequence; the start is elided beyond that

def event_log_markdown(events: Sequence[Event], limit: int = 60,
                       empty: str = "No events yet: start a sequence.") -> str:
    """The last step's events, one narrated line each (`empty` when there are none)."""
    if not events:
        return f"_{empty}_"
    lines = [f"- `{e.kind}` {html.escape(e.text, quote=False)}" for e in events[:limit]]
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
        for i in range(start, seq.num_tokens):
            j, slot = divmod(i, bs)
            block = seq.block_table[j] if j < len(seq.block_table) else "?"
            shade = "rgba(76,120,168,0.18)" if j % 2 == 0 else "rgba(84,162,75,0.22)"
            spans.append(f"<span title='logical block {j} → physical {block}, slot {slot}' "
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
            f"{plural(len(seq.block_table), 'block')}{cached})"
            f"</small><div style='font-family:monospace;font-size:13px;line-height:1.6'>"
            f"{''.join(spans)}</div></div>")
    return "".join(parts)


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
    for key in ("requests_running", "requests_waiting", "requests_swapped", "preemptions"):
        if m.extra.get(key):
            rows.append((key.replace("_", " "), m.extra[key]))
    body = "".join(f"<tr><td>{html.escape(k)}</td><td><b>{html.escape(str(v))}</b></td></tr>"
                   for k, v in rows)
    return f"<table style='font-size:13px;width:100%'>{body}</table>"
