"""vLLM's KV event schema on the wire, and PagedLab's typed events made from it.

vLLM (vllm/distributed/kv_events.py, here as in vLLM 0.32.0) publishes one ZMQ message per
engine step that changed its prefix cache: three frames (topic, sequence number as 8 bytes
big-endian, payload). The payload is msgpack of `KVEventBatch`, an array `[ts, events,
data_parallel_rank]` whose events are msgspec-tagged maps: `BlockStored` (the hashes of one or
more full blocks that got cached, their parent's hash, their tokens, the block size),
`BlockRemoved` (hashes evicted) and `AllBlocksCleared` (the prefix cache was reset). The structs
below mirror those; fields vLLM added later decode as unknown and are ignored, and a frame of
an older layout (vLLM's example subscriber once had array-like events) fails with a message.

Hashes: vLLM publishes the last 8 bytes of a block's digest as an int (its default,
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), or the digest's bytes; both become that same int here,
which is what PagedLab's own hash is with the same algorithm (engine/core/hashing.py).
Events never carry physical block ids, block tables or reference counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

#: the vLLM release whose schema these structs mirror
SCHEMA_VERSION = "vLLM 0.32.0"
_LOW_64 = (1 << 64) - 1


class _EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(_KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class BlockRemoved(_KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(_KVCacheEvent):
    pass


class KVEventBatch(_EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


@dataclass(frozen=True, slots=True)
class VllmEvent:
    """One KV event of a watched vLLM, as PagedLab reads it.

    kind: "stored" (full blocks got cached), "removed" (evicted) or "cleared" (the whole prefix
    cache reset). `block_hashes` are ints (see the module's docstring); for "stored",
    `parent_hash` is the hash the first of them chains from (None: a prompt's first block) and
    `token_ids` are all their tokens, `block_size` per block. `seq` is the number of the
    message (batch) it came in, `ts` vLLM's time of that step."""

    kind: str
    seq: int
    ts: float
    block_hashes: tuple[int, ...] = ()
    parent_hash: int | None = None
    token_ids: tuple[int, ...] = ()
    block_size: int = 0
    medium: str | None = None
    group: int = 0
    extra_keys: bool = False  # vLLM mixed more than tokens into these hashes (LoRA, images, salt)

    def blocks(self) -> list[tuple[int, int | None, tuple[int, ...]]]:
        """(hash, parent hash, tokens) of each block of a "stored" event, in chain order."""
        out = []
        parent = self.parent_hash
        bs = self.block_size
        for i, h in enumerate(self.block_hashes):
            out.append((h, parent, self.token_ids[i * bs:(i + 1) * bs]))
            parent = h
        return out


class SchemaError(ValueError):
    """A message that is not vLLM's KV event batch of the schema PagedLab reads."""


_decoder = msgspec.msgpack.Decoder(type=KVEventBatch)


def as_int(h: int | bytes | None) -> int | None:
    """A published hash as PagedLab's int: an int as is, a digest's last 8 bytes."""
    if isinstance(h, bytes):
        return int.from_bytes(h, "big") & _LOW_64
    return h


def decode_batch(seq: int, payload: bytes) -> list[VllmEvent]:
    """The events of one message's payload; SchemaError (with msgspec's reason) if it is not a
    KVEventBatch of the schema above."""
    try:
        batch = _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise SchemaError(f"message {seq} is not a KV event batch of the schema PagedLab reads "
                          f"({SCHEMA_VERSION}: [ts, events, dp_rank] with events as tagged maps "
                          f"BlockStored / BlockRemoved / AllBlocksCleared): {err}") from None
    out = []
    for e in batch.events:
        if isinstance(e, BlockStored):
            out.append(VllmEvent("stored", seq, batch.ts, tuple(map(as_int, e.block_hashes)),
                                 as_int(e.parent_block_hash), tuple(e.token_ids), e.block_size,
                                 e.medium, e.group_idx or 0,
                                 bool(e.lora_name or e.lora_id or _any(e.extra_keys))))
        elif isinstance(e, BlockRemoved):
            out.append(VllmEvent("removed", seq, batch.ts, tuple(map(as_int, e.block_hashes)),
                                 medium=e.medium, group=e.group_idx or 0))
        else:
            out.append(VllmEvent("cleared", seq, batch.ts))
    return out


def _any(extra_keys: list[Any] | None) -> bool:
    return bool(extra_keys) and any(k is not None for k in extra_keys)


_encoder = msgspec.msgpack.Encoder()


def encode_batch(ts: float, events: list[BlockStored | BlockRemoved | AllBlocksCleared]) -> bytes:
    """A payload as vLLM's publisher encodes it (for tests and the bench's publisher)."""
    return _encoder.encode(KVEventBatch(ts=ts, events=events))
