"""Speculative decoding in the picture: the step's draft slots.

A draft's kept tokens are ordinary tokens now; their slots get a solid outline for the step that
kept them. The rejected ones' slots are empty again (a block that held only rejected tokens went
back to the pool, drawn as freed); each shows its rejected token struck out in a dotted outline,
and an invisible twin that the page fades out (ui/motion.js: "rejected ghost"), so the guess
visibly clears. Every rolled-back slot shows its struck-out token, the first one too, where the
model's own pick (the pending token) goes next: the pool leaves the pending mark out of such a
slot for this step (`rolled_back`), and the table row still shows the pending token. A hybrid
model writes a draft token into the same slot of each KV cache group's block: each is marked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import plotly.graph_objects as go

from engine.core.events import Event
from engine.describe.snapshot import Snapshot
from viz import palette
from viz.pool_cells import FAST
from viz.pool_layout import PoolLayout

HALF_H = 0.44


def draft_slots(events: Sequence[Event], snap: Snapshot) -> tuple[list, list]:
    """(kept, rejected) slots of the step's drafts, as (block, slot, token)."""
    drafts = {e.seq_id: e for e in events if e.kind == "draft" and not e.form}
    rejects = {e.seq_id: e for e in events if e.kind == "reject"}
    bs = snap.block_size
    kept: list = []
    rejected: list = []
    for sid, d in drafts.items():
        seq = snap.sequences.get(sid)
        if seq is None:  # finished in the same step: its blocks are drawn as freed
            continue
        r = rejects.get(sid)
        keep = len(d.token_ids) - (len(r.token_ids) if r else 0)
        for table in _tables_during_step(snap, seq.block_tables, r):
            for j, tok in enumerate(d.token_ids):
                p = d.facts.start + j
                if p // bs < len(table) and table[p // bs] is not None:
                    (kept if j < keep else rejected).append((table[p // bs], p % bs, tok))
    return kept, rejected


def rolled_back(events: Sequence[Event], snap: Snapshot) -> set[tuple[int, int]]:
    """(block, slot) of every slot the step's rejected drafts gave back."""
    if not any(e.kind == "reject" for e in events):
        return set()
    return {(b, s) for b, s, _ in draft_slots(events, snap)[1]}


def _tables_during_step(snap: Snapshot, tables: Mapping[str, Sequence[int | None]],
                        reject: Event | None) -> list[list[int | None]]:
    """Each group's table as it was while the draft was verified: the blocks the reject gave
    back (several groups' blocks, each group's in logical order) appended to their group's."""
    back = reject.block_ids if reject else ()
    if len(tables) == 1:
        return [list(t) + list(back) for t in tables.values()]
    group = {b.block_id: b.group for b in (snap.blocks[i] for i in back if 0 <= i < snap.num_blocks)}
    return [list(t) + [b for b in back if group.get(b) == name] for name, t in tables.items()]


def draft_marks(events: Sequence[Event], snap: Snapshot, gpu: PoolLayout,
                token_text: Callable[[int], str], scale: float = 1.0) -> list:
    """The marks of the step's kept and rejected draft slots (token-level pictures only)."""
    if not gpu.token_level or not any(e.kind == "draft" for e in events):
        return []
    kept, rejected = draft_slots(events, snap)
    kept = [s for s in kept if gpu.where(s[0]) is not None]
    rejected = [s for s in rejected if gpu.where(s[0]) is not None]
    out = _outline(gpu, kept, "draft kept", palette.DRAFT, None)
    out += _outline(gpu, rejected, "draft rejected", palette.REJECTED, "dot")
    if rejected:  # every rolled-back slot shows its token struck out (the pool leaves it blank)
        out += _outline(gpu, rejected, "rejected ghost", palette.REJECTED, None, fill=True)
        xs, ys = zip(*(_centre(gpu, b, s) for b, s, _ in rejected), strict=True)
        out.append(go.Scatter(**FAST, x=xs, y=ys, mode="text", name="rejected tokens",
                              text=[f"<s>{token_text(t)}</s>" for _, _, t in rejected],
                              textfont={"color": palette.REJECTED, "size": 10 * scale},
                              hoverinfo="skip", showlegend=False))
    return out


def _centre(gpu: PoolLayout, block: int, slot: int) -> tuple[float, float]:
    left, _, y = gpu.box(block)
    return left + gpu.label_w + slot + 0.5, y


def _outline(gpu: PoolLayout, slots: list, name: str, colour: str, dash: str | None,
             fill: bool = False) -> list:
    xs: list = []
    ys: list = []
    for b, s, _ in slots:
        x, y = _centre(gpu, b, s)
        xs += [x - 0.46, x + 0.46, x + 0.46, x - 0.46, x - 0.46, None]
        ys += [y - HALF_H, y - HALF_H, y + HALF_H, y + HALF_H, y - HALF_H, None]
    if not xs:
        return []
    if fill:  # the twin the page fades out; invisible in a static image
        style = {"fill": "toself", "fillcolor": colour, "line": {"width": 0}, "opacity": 0.0}
    else:
        style = {"line": {"color": colour, "width": 2, "dash": dash}}
    return [go.Scatter(**FAST, x=xs, y=ys, mode="lines", name=name, hoverinfo="name",
                       showlegend=False, **style)]
