"""Checkpoints: restoring one and running the ops after it gives exactly what a replay from the
start gives (the op log, the snapshot, every event, the generated tokens of seeded sampling and
beams, and the K/V bytes of every block that holds data), on the dry engine, tiny-random and the
real default model; a checkpoint stays usable after a restore."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams, ops

OPS = [
    ops.AddSequence("Four score and seven years ago"),
    ops.Append(0, 5),
    ops.Fork(0),
    ops.Append(1, 3),  # a copy-on-write
    ops.AddRequest("Paged memory is", SamplingParams(max_tokens=6, n=2, temperature=0.9, seed=7)),
    ops.Step(),
    ops.Free(0),
    ops.AddRequest("The best way", SamplingParams(max_tokens=4, beam_width=2)),
    ops.Step(),
    ops.Step(),
    ops.Append(1, 2),
    ops.Step(),
    ops.Step(),
]


def kv_bytes(eng: LLMEngine) -> dict[int, list]:
    """Every used or cached block's K and V in the first layer, in its filled slots (an empty
    slot's bytes are whatever was there: nothing reads them before they are written)."""
    if eng.config.dry:
        return {}
    return {b.block_id: [t[: b.num_filled].tolist() for t in eng.inspect_block(b.block_id, 0)]
            for b in eng.snapshot().blocks if b.state != "free"}


def state(eng: LLMEngine):
    snap = eng.snapshot()
    finished = [(o.request_id, [list(c.token_ids) for c in o.outputs]) for o in eng.finished_requests()]
    return eng.trace, snap, [e.text for e in eng.last_events], finished, kv_bytes(eng)


@pytest.fixture(params=["dry", "tiny-random", pytest.param("default", marks=pytest.mark.slow)])
def config(request) -> EngineConfig:
    if request.param == "dry":
        return EngineConfig(model=None, block_size=4, num_gpu_blocks=24, num_cpu_blocks=8)
    return EngineConfig(model=request.param, block_size=4, num_gpu_blocks=24, num_cpu_blocks=8,
                        device="cpu", dtype="float32")


@pytest.mark.parametrize("at", [3, 6, 9])
def test_restore_then_the_rest_equals_a_replay(config, at):
    eng = LLMEngine(config)
    for op in OPS[:at]:
        eng.apply(op)
    cp = eng.checkpoint()
    assert cp is not None and cp.position == at
    for op in OPS[at:]:
        eng.apply(op)
    want = state(eng)
    for _ in range(2):  # the checkpoint survives a restore
        eng.restore(cp)
        assert len(eng.trace) == at
        eng.check_invariants()
        for op in OPS[at:]:
            eng.apply(op)
        assert state(eng) == want
    replayed = LLMEngine.replay(config, eng.trace)
    assert state(replayed) == want


def test_restore_writes_back_bytes_that_were_overwritten(tiny_model):
    """The blocks of a freed sequence are evicted and rewritten by another prompt; restoring
    brings back their K/V, so a prefix hit on the old text reads the right bytes."""
    config = EngineConfig(model="tiny-random", block_size=4, num_gpu_blocks=8, num_cpu_blocks=0,
                          device="cpu", dtype="float32")
    eng = LLMEngine(config)
    eng.apply(ops.AddSequence("Four score and seven years ago"))
    eng.apply(ops.Append(0, 5))
    before, cp = state(eng), eng.checkpoint()
    eng.apply(ops.Free(0))
    eng.apply(ops.AddSequence(list(range(300, 330))))  # 30 tokens: every block, old ones evicted
    assert kv_bytes(eng) != before[-1]
    eng.restore(cp)
    assert state(eng) == before
    eng.apply(ops.Free(0))
    eng.apply(ops.AddSequence("Four score and seven years ago"))  # a prefix hit on restored bytes
    assert state(eng) == state(LLMEngine.replay(config, eng.trace))
