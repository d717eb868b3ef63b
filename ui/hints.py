"""The playground's next move: one short sentence after each operation that says what to try
next and what the picture will show then (after New sequence, Fork; after Fork, an Append that
copies the shared tail; after a copy, the inspector on both blocks; ...). Read from the snapshot
and the last step's events only, so Back and Next show the hint of the point they draw."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def next_move(snap: Any, events: Sequence[Any], selected: int | None) -> str:
    """The hint for the playground at this point ("" when serving is under way)."""
    kinds = {e.kind for e in events}
    if snap.metrics.extra.get("requests_running") or snap.metrics.extra.get("requests_waiting"):
        return "Press **Step** to run one scheduler iteration, or **Run to the end**."
    if not snap.sequences:
        if any(b.state == "cached" for b in snap.blocks):
            return ("Press **New sequence** with the same prompt: its full blocks come back from "
                    "the prefix cache (gold outline).")
        return "Press **New sequence**: the prompt's tokens fill blocks, slot by slot."
    if "cow" in kinds:
        cow = next(e for e in events if e.kind == "cow")
        return (f"Click blocks {cow.block_ids[0]} and {cow.block_ids[1]}: the inspector shows the "
                "same K/V in the copied slots, and the new token only in the copy.")
    seq = snap.sequences.get(selected) if selected is not None else None
    seq = seq or list(snap.sequences.values())[-1]
    table = seq.block_table
    last = snap.blocks[table[-1]] if table else None
    if last is not None and last.ref_count > 1 and last.num_filled < snap.block_size:
        return (f"**Append** 1 to seq {seq.seq_id}: its last block {last.block_id} is shared and "
                "not full, so the engine copies it before writing.")
    if "prefix_hit" in kinds:
        return "Gold: blocks served by the prefix cache. **Free** a sequence to see them stay cached."
    if len(snap.sequences) == 1 and last is not None and last.num_filled < snap.block_size:
        return (f"**Fork** seq {seq.seq_id}: the child shares all {len(table)} blocks (ref count 2), "
                "nothing is copied.")
    if last is not None and last.num_filled == snap.block_size:
        return f"**Append** 1 to seq {seq.seq_id}: its last block is full, so a new block is taken."
    return (f"**Append** tokens to seq {seq.seq_id} until its last block fills, or **Free** it "
            "to see its blocks return to the pool.")
