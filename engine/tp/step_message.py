"""What the engine sends its tensor-parallel workers, as bytes: one message a step.

Two kinds of message:

- a **device step** (decodes, drafts to verify, short rests of prompts: what the decode graphs
  run, engine/runtime/decode_graphs.py) is binary: a header, then int32 arrays of the step's
  tokens and positions, the rows of the persistent batch (only when they differ from the last
  device step's), the table entries that changed (flat index, block id), the tokens to read
  from the last step's picks (async scheduling), and the step's block copies. Its size grows
  with the batch and with what changed, never with the width of the block tables: a decode of
  32 sequences whose tables did not change is 24 + 32 x 8 bytes.
- anything else (a prefill, a mixed step, a command) is a pickled dict: a prefill sends each
  new sequence's table once, as vLLM's new requests do.

Both may carry the step's copy and swap lists (`cache_ops`), applied by every worker to its own
slice of the pool, in order, before the step runs.
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DEVICE_STEP, OBJECT = 1, 2
ROWS, DRAFTS, CHECK = 1, 2, 4  # flags: rows sent, draft lengths sent, tables to check follow
_HEADER = struct.Struct("<BBHIIII")  # kind, flags, q, n, changed entries, fed tokens, op ints
OPS = ("copy_blocks", "swap_out", "swap_in")  # block copies a step can carry, by code

CacheOps = list[tuple[str, list[tuple[int, int]]]]


@dataclass
class DeviceStep:
    """One device step, as both sides hold it (numpy int32 arrays on the worker's side)."""

    q: int
    tokens: Any  # n x q, a row's draft padded with zeros; 0 where the token is fed
    positions: Any  # n: each row's first new position
    drafts: Any | None  # n: each row's draft length (None: all 0, a plain decode)
    num_logits: Any | None  # n, with drafts: rows of logits each wants (k + 1, or 1: a prompt)
    rows: Any | None  # n: the persistent batch's row of each (None: the last device step's)
    index: Any  # flat indexes into the persistent tables that changed ...
    value: Any  # ... and their new block ids
    feed: Any = ()  # (batch index, row of the last step's picks) pairs, flattened
    cache_ops: CacheOps = field(default_factory=list)
    check: Any = None  # tests: every group's tables of the step, compared on the device

    @property
    def n(self) -> int:
        return len(self.positions)


def encode_device_step(s: DeviceStep) -> bytes:
    flags = (ROWS if s.rows is not None else 0) | (DRAFTS if s.drafts is not None else 0) | (
        CHECK if s.check is not None else 0)
    ops = [v for op, pairs in s.cache_ops for v in (OPS.index(op), len(pairs), *_flat(pairs))]
    parts = [s.tokens, s.positions]
    parts += [s.drafts, s.num_logits] if s.drafts is not None else []
    parts += [s.rows] if s.rows is not None else []
    parts += [s.index, s.value, s.feed, ops]
    body = np.concatenate([np.asarray(p, dtype=np.int32).ravel() for p in parts]).tobytes()
    head = _HEADER.pack(DEVICE_STEP, flags, s.q, s.n, len(s.index), len(s.feed) // 2, len(ops))
    return head + body + check_tail(s)


def check_tail(s: DeviceStep) -> bytes:
    """The tests' full tables after a step's message (none on the product's path)."""
    return pickle.dumps(s.check, protocol=pickle.HIGHEST_PROTOCOL) if s.check is not None else b""


def encode_object(obj: dict[str, Any]) -> bytes:
    return bytes([OBJECT]) + pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def decode(raw: bytes) -> DeviceStep | dict[str, Any]:
    """A message as the worker reads it: a DeviceStep (arrays are read-only views of `raw`) or
    a command's dict."""
    if raw[0] == OBJECT:
        return pickle.loads(raw[1:])
    kind, flags, q, n, changed, fed, op_ints = _HEADER.unpack_from(raw)
    if kind != DEVICE_STEP:
        raise ValueError(f"not a step message (kind {kind})")
    count = n * q + n + (2 * n if flags & DRAFTS else 0) + (n if flags & ROWS else 0) \
        + 2 * changed + 2 * fed + op_ints
    ints = np.frombuffer(raw, dtype=np.int32, count=count, offset=_HEADER.size)
    at = 0

    def take(k: int) -> Any:
        nonlocal at
        at += k
        return ints[at - k:at]

    tokens, positions = take(n * q), take(n)
    drafts, num_logits = (take(n), take(n)) if flags & DRAFTS else (None, None)
    rows = take(n) if flags & ROWS else None
    index, value, feed = take(changed), take(changed), take(2 * fed)
    ops, cache_ops = take(op_ints).tolist(), []
    while ops:
        code, m = ops[0], ops[1]
        flat, ops = ops[2:2 + 2 * m], ops[2 + 2 * m:]
        cache_ops.append((OPS[code], list(zip(flat[::2], flat[1::2], strict=True))))
    end = _HEADER.size + 4 * count
    check = pickle.loads(raw[end:]) if flags & CHECK else None
    return DeviceStep(q, tokens, positions, drafts, num_logits, rows, index, value, feed,
                      cache_ops, check)


def _flat(pairs: list[tuple[int, int]]) -> list[int]:
    return [v for pair in pairs for v in pair]
