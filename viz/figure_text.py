"""The main picture's words: its title, its legend (wrapped to the picture's width) and the
headers over the tables and the pool, short where the picture is narrow (a phone)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from engine.core.events import Event
from engine.describe.snapshot import Snapshot
from viz import palette
from viz.block_tables import group_label

FONT = "'Source Sans 3', 'Source Sans Pro', system-ui, sans-serif"


def legend(budget: int, extra: Sequence[str] = ()) -> list[str]:
    """The legend's lines, each at most `budget` visible characters: the colours first, the
    marks after them, then the entries for what only some pictures show."""
    def swatch(colour: str, label: str, edge: str = "") -> str:
        return f"<span style='color:{edge or colour}'>■</span> {label}"
    owners = "".join(f"<span style='color:{c}'>■</span>" for c in palette.OWNERS[:4])
    parts = [
        f"{owners} owned by one sequence", swatch(palette.SHARED, "shared", "#c9b800"),
        swatch(palette.CACHED, "cached"), "□ free / empty slot", "▸ pending token",
        f"<span style='color:{palette.NEW}'>▭</span> new", "➜ copy-on-write",
        f"<span style='color:{palette.PREFIX_HIT}'>▭</span> prefix hit",
        f"<span style='color:{palette.EVICT}'>┅</span> evicted", *extra]
    lines: list[list[str]] = [[]]
    for part in parts:
        if lines[-1] and visible(lines[-1] + [part]) > budget:
            lines.append([])
        lines[-1].append(part)
    return [" · ".join(line) for line in lines]


def visible(parts: Sequence[str]) -> int:
    """Characters that legend parts show, joined by " · " (their HTML tags take no room)."""
    return sum(len(re.sub("<[^>]*>", "", p)) + 3 for p in parts)


def extras(events: Sequence[Event], dropped: bool) -> list[str]:
    """Legend entries for what this picture shows only at times."""
    kinds = {e.kind for e in events}
    out = []
    if dropped:  # some table has an entry a sliding window dropped
        out.append(f"<span style='color:{palette.HATCH}'>▨</span> dropped (left the window)")
    if "draft" in kinds:  # the step verified drafts (speculative decoding)
        # the marks as drawn: a solid outline round a kept slot, a dotted one round a struck-out
        # token in a rolled-back slot (a dotted glyph for "kept" read as the rejected slots')
        out += [f"<span style='color:{palette.DRAFT}'>▭</span> draft kept",
                f"<span style='color:{palette.REJECTED}'>⬚<s>abc</s></span> draft rejected"]
    if "offload" in kinds:
        out.append(f"<span style='color:{palette.OFFLOAD}'>⇣</span> offload to the CPU tier")
    if "load" in kinds:
        out.append(f"<span style='color:{palette.LOAD}'>⇡</span> load from the CPU tier")
    return out


def groups_title(snap: Snapshot) -> str:
    """The title's words for a model with KV cache groups or a sliding window ("" for most)."""
    groups = snap.kv_cache_groups
    if len(groups) > 1:
        return "groups: " + " + ".join(map(group_label, groups))
    return f"sliding window: {groups[0].window} tokens" if groups[0].sliding else ""


def title(snap: Snapshot, narrow: bool) -> str:
    """The title's first line: the step, the pool, the mode (a phone's: short)."""
    if narrow:
        return f"<b>step {snap.step}</b> · {snap.num_blocks}×{snap.block_size} · {snap.mode}"
    return (f"<b>engine step {snap.step}</b> · {snap.num_blocks} blocks × {snap.block_size} slots"
            f" · {snap.mode}")


def tables_header(hybrid: bool, narrow: bool) -> str:
    if narrow:
        return "block tables: logical → physical"
    return ("a block table per KV cache group: logical → physical block, slots filled" if hybrid
            else "block tables: logical block → physical block, slots filled")


def pool_header(token_level: bool, sliding_marks: bool, reserved: int, narrow: bool) -> str:
    kind = "each block's slots with their tokens" if token_level else "one cell per block"
    if narrow:
        kind = "blocks and their tokens" if token_level else "one cell per block"
    if sliding_marks and token_level:  # a hybrid's two groups: whose K/V a block holds
        kind = "ˢ: a sliding group's block" if narrow else kind + " · ˢ: a sliding group's block"
    if reserved:
        # short words: at a projector's type "hatched: 56 blocks reserved by the teacher" ran past
        # the picture's right edge (the hatch's hover and the room's table name the teacher)
        if narrow:
            return f"GPU pool · hatched: {reserved} reserved"
        kind += f" · hatched: {reserved} reserved"
    return f"GPU pool: {kind}"


def token_lines(table: Sequence[int | None], blocks: Sequence, token_text, width_px: float,
                font_px: float) -> list[str]:
    """A sequence's tokens, block by block ("#3: Four|score|and|seven"), wrapped into lines of
    `width_px` at `font_px`: a phone's picture cannot show them in their slots, so it lists the
    selected sequence's under the pool."""
    from viz.text_width import text_px

    lines: list[str] = []
    line = ""

    def add(piece: str, sep: str) -> None:  # a piece on this line, or the next if it is full
        nonlocal line
        joined = f"{line}{sep}{piece}" if line else piece
        if line and text_px(joined, font_px) > width_px:
            lines.append(line)
            joined = piece
        line = joined

    for b in table:
        if b is None:
            continue
        words = [(token_text(t).replace("\n", "⏎").strip() or "␣") for t in blocks[b].token_ids]
        add(f"#{b}: {words[0]}" if words else f"#{b}:", "   ")
        for w in words[1:]:  # a block longer than a line goes on over the next (a phone)
            add(w, "|")
    if line:
        lines.append(line)
    return [ln.replace("&", "&amp;").replace("<", "&lt;") for ln in lines]
