"""Memory over time: one point per serving step, read from the step's snapshot (the blocks by
state) and its events (what the step did to them), for the memory view (viz/memory.py).

A pure function of what the engine recorded, so the page's recorded views, a lesson's pages and
a classroom's published states all give the same series for the same run.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from engine.core.events import Event


class MemoryPoint(NamedTuple):
    step: int
    owned: int  # GPU blocks held by one sequence (ref count 1)
    shared: int  # GPU blocks held by several (ref count > 1)
    cached: int  # GPU blocks no one holds that keep their hash (prefix cache)
    free: int  # GPU blocks with nothing in them
    swapped: int  # CPU swap blocks holding swapped-out sequences
    tier: int  # CPU tier slots holding cached prefix blocks
    preemptions: int  # requests preempted in the step
    evictions: int  # cached blocks evicted in the step
    prefix_hits: int  # prompt blocks served by the GPU pool's prefix cache in the step
    loads: int  # prompt blocks copied back from the CPU tier in the step
    tokens: int  # tokens the step's forward pass computed (prefill chunks, decodes, drafts)
    output_tokens: int  # tokens the step added to outputs (one per decode, plus kept drafts)
    decodes: int  # sequences that decoded in the step
    drafted: int  # draft tokens the step verified
    prompt_tokens: int  # tokens of the prompts that began prefill in the step
    hit_tokens: int  # of them, served by the prefix cache (the GPU pool or the CPU tier)

    @property
    def used(self) -> int:
        return self.owned + self.shared


def memory_point(snap: Any, events: Iterable[Event]) -> MemoryPoint:
    """The point of one step: `snap` taken after it, `events` its events."""
    owned = shared = 0
    for b in snap.blocks:
        if b.ref_count == 1:
            owned += 1
        elif b.ref_count > 1:
            shared += 1
    m = snap.metrics
    swapped = sum(1 for b in snap.cpu_blocks if b.ref_count)
    tier = sum(1 for b in snap.tier_blocks if b.state == "cached")
    count = {"preempt": 0, "evict": 0, "prefix_hit": 0, "load": 0}
    tokens = decodes = drafted = kept = prompt = hit = 0
    for e in events:
        kind = e.kind
        if kind in ("append", "allocate", "cache"):
            continue
        if kind in ("prefix_hit", "load"):
            count[kind] += len(e.block_ids)
        elif kind in count:
            count[kind] += 1
        elif kind == "decode" and e.seq_id is None:
            decodes = len(e.block_ids)
        elif kind == "prefill":
            f = e.facts
            tokens += f.computed
            if not f.resumed and f.start == f.cached:  # a prompt's first chunk (after its hits)
                prompt += f.num_tokens + f.rest
                hit += f.cached
        elif kind == "reject":
            drafted += e.facts.drafted
            kept += e.facts.accepted
        elif kind == "draft" and e.form == "draft_kept":
            drafted += len(e.token_ids)
            kept += len(e.token_ids)
    return MemoryPoint(snap.step, owned, shared, m.cached_blocks, m.free_blocks, swapped, tier,
                       count["preempt"], count["evict"], count["prefix_hit"], count["load"],
                       tokens + decodes + drafted, decodes + kept, decodes, drafted, prompt, hit)
