"""Typed engine events: what one operation did to the blocks, each with a one-line narration.

Events are the engine's only report of what happened. The UI draws them (new block, copy-on-write
arrow, prefix hit, eviction) and prints their narration; lessons template numbers from them.
"""

from __future__ import annotations

from typing import NamedTuple

#: Every kind of event the engine emits, in the paper's words.
EVENT_KINDS = (
    "allocate",    # a physical block was taken from the pool for a sequence
    "free",        # a sequence let go of its block table (ref counts decremented)
    "share",       # blocks became shared by one more sequence (fork or prefix hit)
    "prefix_hit",  # a new prompt found full blocks of its prefix in the cache
    "cache",       # a block filled and got its content hash: it can now serve prefix hits
    "evict",       # a cached block was reclaimed for a new use; its hash is dropped
    "cow",         # copy-on-write: a shared, partly filled block was copied before a write
    "append",      # one token's K/V went into a slot
    "prefill",     # the model computed a prompt (or the part the prefix cache did not serve)
    "decode",      # the model computed one step for a sequence and sampled its next token
    "preempt",     # a request group was preempted to free memory
    "swap_out",    # blocks copied from the GPU pool to CPU swap space
    "swap_in",     # blocks copied back from CPU swap space
    "finish",      # a request finished
)


class Event(NamedTuple):
    """One thing that happened. A NamedTuple: immutable and cheap to create in the hot path."""

    kind: str
    step: int
    seq_id: int | None
    text: str  # the one-line narration shown to the learner
    block_ids: tuple[int, ...] = ()  # for "cow": (source, copy); for "swap_*": the pairs flattened
    token_ids: tuple[int, ...] = ()
    slot: int | None = None  # for "append": the slot inside the block

    def __str__(self) -> str:
        return f"[step {self.step}] {self.text}"


def blocks_str(block_ids: list[int] | tuple[int, ...]) -> str:
    """'block 3' or 'blocks 3, 4, 7' for narration."""
    ids = ", ".join(str(b) for b in block_ids)
    return f"block {ids}" if len(block_ids) == 1 else f"blocks {ids}"
