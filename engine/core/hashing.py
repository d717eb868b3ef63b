"""Chained content hash of full blocks, the key of the prefix cache.

A block's hash covers its parent's hash and its own token ids, so equal tokens after a different
prefix hash differently (the K/V of a token depends on everything before it). Stored token ids
are compared on lookup, so a hash collision can never cause false sharing.

Two families, chosen by `EngineConfig.prefix_caching_hash_algo` (`hash_function`):

- "pagedlab" (the default): xxh64 over (parent hash, token ids), as nano-vllm does.
- vLLM v1's own: "sha256", "sha256_cbor", "xxhash", "xxhash_cbor"
  (vllm/v1/core/kv_cache_utils.py `hash_block_tokens`, vllm/utils/hashing.py). A block's hash is
  `algo((parent digest or NONE_HASH, tuple(token_ids), None))`, the tuple serialized by pickle
  (protocol 5) or canonical CBOR, then SHA-256 or XXH3-128; `NONE_HASH = algo(seed)`, where the
  seed is vLLM's PYTHONHASHSEED (`hash_seed` here), else "vllm-none-hash" for the sha256 ones.
  vLLM keeps the digest (bytes) and publishes, in its KV events, the int of its last 8 bytes
  (`maybe_convert_block_hash`, on by default). So PagedLab's hash is that int, a
  `VllmBlockHash` that also carries the digest the next block's hash is made from.
"""

from __future__ import annotations

import functools
import hashlib
import pickle
import struct
from collections.abc import Callable, Sequence
from typing import Any

import xxhash

#: Signature of a block hash function: (parent hash or None for the first block, token ids) -> hash.
HashFn = Callable[[int | None, Sequence[int]], int]

#: the algorithms `EngineConfig.prefix_caching_hash_algo` takes; all but "pagedlab" are vLLM's
ALGORITHMS = ("pagedlab", "sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
#: vLLM's seed of NONE_HASH when PYTHONHASHSEED is unset and the algorithm is a sha256 one
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
_LOW_64 = (1 << 64) - 1


def hash_block(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """xxh64 of the parent block's hash followed by this block's token ids (as int64), both
    little-endian: the bytes packed in one call (a 4,096-token prefix hashes 256 blocks)."""
    if parent_hash is None:
        return xxhash.xxh64_intdigest(_packer(len(token_ids), False)(*token_ids))
    return xxhash.xxh64_intdigest(_packer(len(token_ids), True)(parent_hash, *token_ids))


@functools.cache  # a pure function of a block's size: one Struct per size, compiled once
def _packer(n: int, parent: bool) -> Callable[..., bytes]:
    return struct.Struct(f"<{'Q' if parent else ''}{n}q").pack


class VllmBlockHash(int):
    """A vLLM block hash as its KV events publish it (the digest's last 8 bytes as a big-endian
    int), carrying the whole digest, which vLLM chains the next block's hash from."""

    digest: bytes

    def __new__(cls, digest: bytes) -> VllmBlockHash:
        self = super().__new__(cls, int.from_bytes(digest, "big") & _LOW_64)
        self.digest = digest
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return VllmBlockHash, (self.digest,)


def _serializer(algo: str) -> Callable[[Any], bytes]:
    if algo.endswith("_cbor"):
        import cbor2  # only for the CBOR algorithms, as in vLLM

        return lambda obj: cbor2.dumps(obj, canonical=True)
    return lambda obj: pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _digester(algo: str) -> Callable[[bytes], bytes]:
    if algo.startswith("sha256"):
        return lambda data: hashlib.sha256(data).digest()
    return xxhash.xxh3_128_digest


def vllm_none_hash(algo: str, seed: str | None) -> bytes:
    """vLLM's NONE_HASH, the parent of every prompt's first block (`init_none_hash`)."""
    if seed is None:
        if algo.startswith("xxhash"):
            raise ValueError(f"vLLM draws a random NONE_HASH seed per process for {algo!r}: give "
                             f"hash_seed, and start vLLM with PYTHONHASHSEED set to the same value")
        seed = DEFAULT_NONE_HASH_SEED
    return _digester(algo)(_serializer(algo)(seed))


def hash_function(algo: str = "pagedlab", seed: str | None = None) -> HashFn:
    """The block hash function of `algo` (one of ALGORITHMS), seeded like vLLM's PYTHONHASHSEED."""
    if algo not in ALGORITHMS:
        raise ValueError(f"prefix_caching_hash_algo must be one of {', '.join(ALGORITHMS)}, "
                         f"got {algo!r}")
    if algo == "pagedlab":
        if seed is not None:
            raise ValueError("the 'pagedlab' hash chain has no seed: leave hash_seed None, or "
                             "pick one of vLLM's algorithms")
        return hash_block
    serialize, digest = _serializer(algo), _digester(algo)
    none_hash = vllm_none_hash(algo, seed)

    def vllm_hash(parent_hash: int | None, token_ids: Sequence[int]) -> int:
        if parent_hash is None:
            parent = none_hash
        elif isinstance(parent_hash, VllmBlockHash):
            parent = parent_hash.digest
        else:  # a plain int has lost the digest the chain goes on from
            raise TypeError(f"parent hash {parent_hash:#x} is not a {algo} block hash")
        return VllmBlockHash(digest(serialize((parent, tuple(map(int, token_ids)), None))))

    return vllm_hash
