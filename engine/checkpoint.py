"""An engine's state at one point of its op log, to go back to without replaying from the start.

A checkpoint holds a deep copy of the bookkeeping (block pools, tables, sequences, scheduler
queues, the sampler's per-request keys, the op log: everything but the model) and a copy of the
K/V bytes of every block that holds data then: used and cached blocks of the pool, used blocks of
the swap space. Free blocks are not kept: nothing reads a free block before it is written again.
The model's weights and the tokenizer are shared, never copied.

Restoring puts that state back into the same engine (its runtime and KV pool stay; their bytes
are overwritten), so the ops that follow give the same tokens, events and bytes as a replay from
the start would: tests/engine/test_checkpoint.py checks this on dry, tiny-random and the real
model. A step still in flight (async scheduling) is landed by the caller first: a checkpoint is
taken between operations, where the engine is settled.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

#: attributes restored by reference, never copied: the model and everything that reads it
SHARED = ("config", "runtime", "tokenizer")


@dataclass(frozen=True)
class Checkpoint:
    position: int  # len(trace) when it was taken
    state: dict[str, Any]  # the engine's attributes, deep-copied (SHARED ones by reference)
    kv: Any  # the runtime's saved blocks (None in the dry mode)
    kv_bytes: int  # what the saved blocks take


def _memo(engine: Any) -> dict[int, Any]:
    """Deep copies keep the shared objects as they are."""
    memo: dict[int, Any] = {}
    for name in SHARED:
        obj = getattr(engine, name, None)
        if obj is not None:
            memo[id(obj)] = obj
    return memo


def _holding(pool: Any) -> list[int]:
    return [b.block_id for b in pool.blocks if b.state != "free"]


def can_take(engine: Any) -> bool:
    """Between settled operations, on a runtime that can save its blocks (not tensor parallel,
    whose bytes live in worker processes), while the CPU tier holds nothing (its bytes are not
    saved: a restore from the start replays them)."""
    settled = engine._flight.launched is None and not len(engine.kv.tier)
    return settled and (engine.runtime is None or hasattr(engine.runtime, "save_blocks"))


def take(engine: Any) -> Checkpoint:
    state = copy.deepcopy(engine.__dict__, _memo(engine))
    kv, size = None, 0
    if engine.runtime is not None:
        kv = engine.runtime.save_blocks(_holding(engine.kv.pool), _holding(engine.kv.cpu_pool))
        size = engine.runtime.saved_bytes(kv)
    return Checkpoint(len(engine.trace), state, kv, size)


def restore(engine: Any, checkpoint: Checkpoint) -> None:
    """The engine as it was when `checkpoint` was taken (the checkpoint stays usable)."""
    state = copy.deepcopy(checkpoint.state, _memo(engine))
    for name in SHARED:
        state[name] = getattr(engine, name)
    engine.__dict__.clear()
    engine.__dict__.update(state)
    if checkpoint.kv is not None:
        engine.runtime.load_blocks(checkpoint.kv)
