"""An engine's state at one point of its op log, to go back to without replaying from the start.

A checkpoint is the sum of declared states, never a copy of whatever hangs off the engine: each
part of the bookkeeping says what its state is and how it is copied (engine/core/state.py: the
KV cache manager with its pools, tier and writer; the content shadow when tracked; the registry
of sequences and requests; the scheduler's queues; the step in flight's reports; the request
timeline and the hash chain), the engine declares its own few values (the op log, the step
count, the last events and step), and the runtime saves what it holds (`save_blocks`: the K/V
bytes of every block that holds data then, used and cached pool blocks and used swap blocks; the
dry mode's RNG state). A free block is not kept: nothing reads it before it is written again.
The model, the runtime, the tokenizer and the config are shared, never copied
(`LLMEngine.FIXED`); the snapshot builder's cache is rebuilt (`LLMEngine.DERIVED`).

Restoring loads those states back into an engine of the same config, this one or another (its
parts in place, the bytes into its own runtime), so the ops that follow give the same tokens,
events and bytes as a replay from the start would: tests/engine/test_checkpoint.py checks this
on dry, tiny-random and the real model. A checkpoint of another config is refused. A step still
in flight (async scheduling) is landed by the caller first: a checkpoint is taken between
operations, where the engine is settled.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from engine.config import EngineConfig

if TYPE_CHECKING:  # the engine calls this module
    from engine.llm_engine import LLMEngine


@dataclass(frozen=True)
class Checkpoint:
    position: int  # len(trace) when it was taken
    config: EngineConfig  # restored only into an engine of this config
    state: dict[str, Any]  # each declared part's state, and the engine's own values
    kv: Any  # what the runtime saved (the K/V bytes; the dry mode's RNG state)
    kv_bytes: int  # what the saved blocks take


def can_take(engine: LLMEngine) -> bool:
    """Between settled operations, on a runtime that can save its blocks (not tensor parallel,
    whose bytes live in worker processes), while the CPU tier holds nothing (its bytes are not
    saved: a restore from the start replays them)."""
    settled = engine._flight.launched is None and not len(engine.kv.tier)
    return settled and engine.runtime.can_save_blocks


def _holding(pool: Any) -> list[int]:
    return [b.block_id for b in pool.blocks if b.state != "free"]


def take(engine: LLMEngine) -> Checkpoint:
    state = {name: part.state() for name in engine.PARTS
             if (part := getattr(engine, name)) is not None}
    state["engine"] = {name: _container(getattr(engine, name)) for name in engine.STATE}
    kv = engine.runtime.save_blocks(_holding(engine.kv.pool), _holding(engine.kv.cpu_pool))
    return Checkpoint(len(engine._trace), engine.config, state, kv, engine.runtime.saved_bytes(kv))


def restore(engine: LLMEngine, checkpoint: Checkpoint) -> None:
    """The engine as it was when `checkpoint` was taken, on this engine or another of the same
    config (the checkpoint stays usable)."""
    if checkpoint.config != engine.config:
        raise ValueError(f"this checkpoint was taken on an engine of another config "
                         f"({_differences(checkpoint.config, engine.config)}); restore it into an "
                         f"engine of the config it was taken on")
    missing = [name for name in engine.PARTS
               if getattr(engine, name) is not None and name not in checkpoint.state]
    if missing:  # the content shadow, tracked here and not where it was taken (an environment)
        raise ValueError(f"this checkpoint holds no state for {', '.join(missing)}: it was taken "
                         f"on an engine that kept none; replay the op log instead")
    engine.runtime.load_blocks(checkpoint.kv)  # first: nothing else changed if it refuses
    state = checkpoint.state
    for name in engine.PARTS:  # in place: the parts that hold one another keep doing so
        part = getattr(engine, name)
        if part is not None:
            part.load_state(state[name])
    for name, value in state["engine"].items():
        setattr(engine, name, _container(value))
    engine._snapshots = engine._snapshot_builder()  # DERIVED: the views' cache starts afresh


def _container(value: Any) -> Any:
    """The engine's own values: a list is copied (its items, events, outputs and op records, are
    never changed once made), anything else is a value."""
    return list(value) if isinstance(value, list) else value


def _differences(taken: EngineConfig, here: EngineConfig) -> str:
    return ", ".join(f"{f.name}={getattr(taken, f.name)!r} there, {getattr(here, f.name)!r} here"
                     for f in fields(EngineConfig) if getattr(taken, f.name) != getattr(here, f.name))
