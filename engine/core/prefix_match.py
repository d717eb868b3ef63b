"""The prefix cache's lookup: how many of a prompt's first blocks are cached, in every group.

A prompt is cut into full blocks and each gets its chained hash (engine/core/hashing.py). With one
KV cache group (most models) the hit is the longest run of blocks from the start that the pool
holds, with the tokens compared (a hash collision never serves wrong K/V). With several groups
(engine/core/kv_groups.py) a hit of k blocks must hold for every group (vLLM v1's hybrid rule):
a full-attention group needs all k blocks; a sliding-window group needs only the blocks its
window shows the first computed token (position k * block_size); the ones before it become None
entries of its table. The hit never covers the whole prompt: at least one prompt token is always
computed, as vLLM caps a hit at num_tokens - 1 (its logits give the next token).
"""

from __future__ import annotations

from typing import Any

from engine.core.kv_groups import first_needed_block


def match_prefix(kv: Any, prompt: list[int]) -> tuple[list[list[int | None]], list[int]]:
    """(each group's table for the hit blocks, the hit blocks' chain hashes), for the KV cache
    manager `kv` (its pool, groups, block size and hash function)."""
    bs, groups, lookup = kv.block_size, kv.groups, kv.pool.lookup
    full = [g for g, group in enumerate(groups) if group.window is None]
    hashes: list[int] = []
    chunks: list[list[int]] = []
    found: list[list[int]] = []  # per block: the block of each full group
    parent = None
    for i in range((len(prompt) - 1) // bs):
        chunk = prompt[i * bs:(i + 1) * bs]
        h = kv.hash_fn(parent, chunk)
        ids = [lookup(h, chunk, g) for g in full]
        if None in ids:
            break
        hashes.append(h)
        chunks.append(chunk)
        found.append(ids)
        parent = h
    hit = len(hashes)
    if len(full) < len(groups):
        hit, sliding = _sliding_hit(kv, hashes, chunks, hit)
    tables: list[list[int | None]] = []
    for g in range(len(groups)):
        if g in full:
            tables.append([found[j][full.index(g)] for j in range(hit)])
        else:
            tables.append(sliding[g])
    return tables, hashes[:hit]


def _sliding_hit(kv: Any, hashes: list[int], chunks: list[list[int]], most: int
                 ) -> tuple[int, dict[int, list[int | None]]]:
    """The longest hit of at most `most` blocks whose window blocks every sliding group holds,
    and those groups' tables for it."""
    bs, lookup = kv.block_size, kv.pool.lookup
    sliding = [(g, group.window) for g, group in enumerate(kv.groups) if group.window is not None]
    seen: dict[tuple[int, int], int | None] = {}

    def block(g: int, j: int) -> int | None:
        if (g, j) not in seen:
            seen[(g, j)] = lookup(hashes[j], chunks[j], g)
        return seen[(g, j)]

    for hit in range(most, 0, -1):
        tables = {}
        for g, window in sliding:
            first = first_needed_block(hit * bs, window, bs)
            ids = [block(g, j) for j in range(first, hit)]
            if None in ids:
                break
            tables[g] = [None] * first + ids
        else:
            return hit, tables
    return 0, {g: [] for g, _ in sliding}
