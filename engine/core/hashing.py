"""Chained content hash of full blocks, the key of the prefix cache.

A block's hash covers its parent's hash and its own token ids, so equal tokens after a different
prefix hash differently (the K/V of a token depends on everything before it). This is the scheme
of vLLM v1 and nano-vllm: xxh64 over (parent hash, token ids). Stored token ids are compared on
lookup, so a hash collision can never cause false sharing.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence

import xxhash

#: Signature of a block hash function: (parent hash or None for the first block, token ids) -> hash.
HashFn = Callable[[int | None, Sequence[int]], int]


def hash_block(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """xxh64 of the parent block's hash followed by this block's token ids (as int64)."""
    h = xxhash.xxh64()
    if parent_hash is not None:
        h.update(parent_hash.to_bytes(8, "little"))
    h.update(array("q", token_ids).tobytes())
    return h.intdigest()
