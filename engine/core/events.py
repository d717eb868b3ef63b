"""Typed engine events: what one operation did to the blocks, as ids and named facts.

Events are the engine's only report of what happened. The UI draws them (new block, copy-on-write
arrow, prefix hit, eviction) and prints their sentences; lessons template numbers from them.
An event keeps ids and numbers only, the facts besides the ids by name (a NamedTuple per kind of
fact, below); its sentence is a function of it, `engine.describe.narrate(event)`, written when a
view reads it, so a serving step decodes no token text that nobody reads. This module knows no
English: the bookkeeping never imports the describing room.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["EVENT_KINDS", "Event"]

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
    "offload",     # a cached block's K/V copied to the CPU tier of the prefix cache (evicted,
                   # or just computed: EngineConfig.tier_store)
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
    facts: Any = ()  # what happened besides the ids, by name: one of the NamedTuples below
    form: str = ""  # which sentence of its kind narrates it ("": the kind's own)
    names: Callable[[int], str] | None = None  # how its sentence shows a token, if it names one


# ---- the facts an event carries besides its ids, by name (one NamedTuple per kind of fact) --------


class PrefixHit(NamedTuple):
    hit_tokens: int  # prompt tokens the hit serves
    prompt_tokens: int


class Forked(NamedTuple):
    parent: int  # the sequence forked (a "share" event of form "fork")


class Freed(NamedTuple):
    cached: tuple[int, ...]  # released blocks that stay cached (hashed)
    kept: tuple[int, ...]  # blocks still used by other tables (ref count - 1)


class Dropped(NamedTuple):
    group: str  # the sliding-window KV cache group
    window: int
    first: int  # the first logical block dropped
    cached: tuple[int, ...]
    kept: tuple[int, ...]


class Allocated(NamedTuple):
    tokens: int  # the tokens the new blocks are for (form "allocate_many")


class Offloaded(NamedTuple):
    slot: int  # the CPU tier slot the block's K/V go to
    hash16: int  # the low 16 bits of its hash, for the sentence
    evicted: bool  # copied as the pool evicts it (else as soon as it was computed: tier_store)


class CopiedOnWrite(NamedTuple):
    shared_by: int  # the sequences that shared the block before the copy


class Cached(NamedTuple):
    hash16: int


class Swapped(NamedTuple):
    seqs: tuple[int, ...]  # the group's sequences


class Loaded(NamedTuple):
    slots: tuple[int, ...]  # the tier slots read, one per block id, in order
    tokens: int  # prompt tokens served


class Drafted(NamedTuple):
    start: int  # the position of the first draft token


class Rejected(NamedTuple):
    accepted: int  # draft tokens kept
    drafted: int


class Prefilled(NamedTuple):
    """A serving step's prefill: whole, or one chunk of a chunked prompt."""

    resumed: bool  # recompute after preemption
    final: bool  # the prompt's last chunk
    whole: bool  # the whole prompt in this step
    start: int  # the first position computed
    num_tokens: int  # the sequence's tokens after it
    computed: int  # tokens computed in this step
    cached: int  # tokens served by the prefix cache
    rest: int  # prompt tokens still to come


class PrimitivePrefill(NamedTuple):
    """`add_sequence`'s prefill (never chunked)."""

    num_tokens: int
    computed: int
    cached: int


class Computed(NamedTuple):
    tokens: int  # tokens a primitive's forward pass computed (form "decode_primitive")


class Preempted(NamedTuple):
    request_id: int
    seqs: tuple[int, ...]
    swapped_blocks: int | None  # None: by recompute
    fallback: bool  # recompute because swap space was full


class Finished(NamedTuple):
    request_id: int
    reason: str


class Aborted(NamedTuple):
    request_id: int
    pool_blocks: int  # the pool it could never fit (form "abort")
