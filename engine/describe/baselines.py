"""Contiguous-reservation allocators, the baselines PagedAttention is measured against.

Before paging, a serving system reserved one contiguous chunk per request (the paper's Fig. 3):
"max" reserves the longest possible sequence (Orca-Max, FasterTransformer), "pow2" its final
length rounded up to a power of two (Orca-Pow2), "oracle" exactly its final length (Orca-Oracle,
which knows the future). The slots a request reserves but does not use are internal
fragmentation. Torch-free.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from engine.describe.snapshot import Snapshot

POLICIES = ("max", "pow2", "oracle")


def workload(count: int, seed: int, max_len: int, vocab: int = 256) -> list[dict[str, Any]]:
    """`count` requests with prompt and output lengths drawn (seeded) so they sum to at most max_len:
    short prompts and outputs of very different lengths, like chat traffic (the paper's Fig. 11
    shows ShareGPT's long tail). Prompts are distinct random token ids, so nothing is shared."""
    if not 1 <= count <= 10_000 or not 8 <= max_len <= 1 << 16:
        raise ValueError("count must be 1..10000 and max_len 8..65536")
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        total = min(max_len, max(2, int(rng.expovariate(1 / (max_len / 5)))))
        prompt = max(1, min(total - 1, int(total * rng.uniform(0.2, 0.6))))
        out.append({"prompt": [rng.randrange(vocab) for _ in range(prompt)], "output": total - prompt,
                    "max_len": max_len})
    return out


def reservation_fit(requests: Sequence[dict[str, Any]], slots: int, policy: str) -> dict[str, Any]:
    """How many requests (in order) a contiguous allocator of `slots` token slots admits, when each
    request reserves: "max" = max_len slots (Orca-Max, FasterTransformer); "pow2" = its final
    length rounded up to a power of two (Orca-Pow2); "oracle" = exactly its final length (Orca-
    Oracle: it knows the future). Returns admitted, reserved and used slots."""
    if policy not in ("max", "pow2", "oracle"):
        raise ValueError(f"policy must be 'max', 'pow2' or 'oracle', got {policy!r}")
    reserved = used = admitted = 0
    refused = False
    for r in requests:
        final = len(r["prompt"]) + r["output"]
        size = reserved_slots(final, r["max_len"], policy)
        if reserved + size > slots:
            refused = True
            break
        reserved += size
        used += final
        admitted += 1
    return {"policy": policy, "admitted": admitted, "reserved": reserved, "used": used,
            "utilization": used / reserved if reserved else 0.0,
            # the paper's Fig. 2/3 terms: slots reserved that never hold a token ...
            "internal_fragmentation": reserved - used,
            # ... and free slots that cannot serve the next request, which needs one chunk
            "external_fragmentation": slots - reserved if refused else 0}


def reserved_slots(final_len: int, max_len: int, policy: str) -> int:
    """Token slots one request reserves under a contiguous policy."""
    return {"max": max_len, "pow2": 1 << (final_len - 1).bit_length(), "oracle": final_len}[policy]


def naive_blocks_for(snap: Snapshot, max_len: int, policy: str = "max") -> int:
    """Blocks that contiguous reservation would hold for the live sequences of a snapshot, with
    no sharing: every sequence reserves its own chunk (final length unknown: its length now)."""
    bs = snap.block_size
    total = 0
    for seq in snap.sequences.values():
        if seq.block_table:
            total += -(-reserved_slots(max(seq.num_tokens, 1), max_len, policy) // bs)
    return total


def paged_fit(requests: Sequence[dict[str, Any]], slots: int, block_size: int) -> dict[str, Any]:
    """The paged counterpart of `reservation_fit`, with no sharing: each request holds
    ceil(final length / block_size) blocks, so only its last block can have empty slots (internal
    fragmentation < block_size per request) and any free block serves anyone (no external
    fragmentation). `lessons.helpers.admit` measures the same on a real dry engine."""
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    num_blocks = slots // block_size
    held = used = admitted = 0
    for r in requests:
        final = len(r["prompt"]) + r["output"]
        blocks = -(-final // block_size)
        if held + blocks > num_blocks:
            break
        held += blocks
        used += final
        admitted += 1
    reserved = held * block_size
    return {"policy": f"paged (block {block_size})", "admitted": admitted, "reserved": reserved,
            "used": used, "utilization": used / reserved if reserved else 0.0,
            "internal_fragmentation": reserved - used, "external_fragmentation": 0}
