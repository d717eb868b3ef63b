"""Typed engine events: what one operation did to the blocks, with a one-line narration.

Events are the engine's only report of what happened. The UI draws them (new block, copy-on-write
arrow, prefix hit, eviction) and prints their narration; lessons template numbers from them.
An event keeps ids and numbers only; its narration (`event.text`) is written on first read by
`engine.core.narration`, so a serving step decodes no token text that nobody reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from engine.core.narration import blocks_str, narrate

__all__ = ["EVENT_KINDS", "Event", "blocks_str"]

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
    "draft",       # speculative decoding: slots reserved for proposed tokens (or all of them kept)
    "reject",      # speculative decoding: rejected draft tokens' slots rolled back
    "offload",     # an evicted cached block's K/V copied to the CPU tier of the prefix cache
    "load",        # a prompt's blocks copied back from the CPU tier instead of recomputed
    "drop",        # a sliding-window group let go of blocks its window has passed
)


class Event(NamedTuple):
    """One thing that happened. A NamedTuple: immutable and cheap to create in the hot path."""

    kind: str
    step: int
    seq_id: int | None
    block_ids: tuple[int, ...] = ()  # for "cow": (source, copy); for "swap_*": the pairs flattened
    token_ids: tuple[int, ...] = ()
    slot: int | None = None  # for "append": the slot inside the block
    facts: tuple = ()  # the numbers its sentence needs besides the ids (narration.py says which)
    form: str = ""  # which sentence of its kind narrates it ("": the kind's own)
    names: Callable[[int], str] | None = None  # how its sentence shows a token, if it names one

    @property
    def text(self) -> str:
        """The one-line narration shown to the learner, written now (not when it happened)."""
        return narrate(self)

    def __str__(self) -> str:
        return f"[step {self.step}] {self.text}"
