"""Checkpoints: restoring one and running the ops after it gives exactly what a replay from the
start gives (the op log, the snapshot, every event, the generated tokens of seeded sampling and
beams, and the K/V bytes of every block that holds data), on the dry engine, tiny-random and the
real default model, into the engine it was taken on or another of its config; a checkpoint stays
usable after a restore. A checkpoint is the sum of declared states (engine/core/state.py): every
attribute of the engine and its parts is declared state, shared or derived."""

from __future__ import annotations

import dataclasses
import random
import threading
import weakref

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from engine import EngineConfig, LLMEngine, SamplingParams, ops
from engine.core.state import undeclared
from engine.describe.narration import narrate

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
    return eng.trace, snap, [narrate(e) for e in eng.last_events], finished, kv_bytes(eng)


@pytest.fixture(params=["dry", "tiny-random", pytest.param("default", marks=pytest.mark.slow)])
def config(request) -> EngineConfig:
    if request.param == "dry":
        return EngineConfig(model=None, block_size=4, num_gpu_blocks=24, num_cpu_blocks=8)
    return EngineConfig(model=request.param, block_size=4, num_gpu_blocks=24, num_cpu_blocks=8,
                        device="cpu", dtype="float32")


# every point on the dry engine and tiny-random; one on the default model (its ops cost the most
# there, and the points differ in the bookkeeping, which the other two cover): after the beams' step
@pytest.mark.parametrize("config, at", [
    *[(name, at) for name in ("dry", "tiny-random") for at in (3, 6, 9)],
    pytest.param("default", 9, marks=pytest.mark.slow)], indirect=["config"])
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


def test_a_checkpoint_restores_into_another_engine_of_the_same_config(config):
    """Issue 40: the page held two engines and restored one's checkpoint into the other. The
    checkpoint is declared state, so it loads into any engine of its config: its bytes into that
    engine's runtime, and the ops after it give what a replay gives, bytes included."""
    first = LLMEngine(config)
    for op in OPS[:6]:
        first.apply(op)
    cp = first.checkpoint()
    second = LLMEngine(config)
    second.apply(ops.AddSequence("something else entirely, to be overwritten"))
    second.restore(cp)
    second.check_invariants()
    for op in OPS[6:]:
        second.apply(op)
        first.apply(op)  # the engine it was taken on goes on by itself, untouched
    assert state(second) == state(first) == state(LLMEngine.replay(config, second.trace))


def test_a_checkpoint_of_another_config_is_refused_and_changes_nothing():
    a = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=24))
    b = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=32))
    a.apply(ops.AddSequence("abcdefgh"))
    b.apply(ops.AddSequence("xyz"))
    before = state(b)
    with pytest.raises(ValueError, match="num_gpu_blocks=24 there, 32 here"):
        b.restore(a.checkpoint())
    assert state(b) == before


@pytest.mark.parametrize("model", [None, "tiny-random"])
def test_a_checkpoint_never_copies_what_hangs_off_the_runtime(model):
    """What the runtime holds (weak methods, locks: neither pickles nor deep-copies) is shared,
    never part of a checkpoint: taking and restoring one works whatever hangs there."""
    config = EngineConfig(model=model, block_size=4, num_gpu_blocks=24, device="cpu",
                          dtype="float32") if model else EngineConfig(model=None, block_size=4,
                                                                       num_gpu_blocks=24)
    eng, other = LLMEngine(config), LLMEngine(config)
    for e in (eng, other):
        e.runtime.lock = threading.Lock()
        e.runtime.callback = weakref.WeakMethod(e.runtime.draft_cost)
    for op in OPS[:4]:
        eng.apply(op)
    cp = eng.checkpoint()
    other.restore(cp)
    eng.restore(cp)
    assert state(other) == state(eng)


def _bookkeeping(obj: object) -> bool:
    """A part of the bookkeeping (not a function it was given, such as how tokens are named)."""
    module = type(obj).__module__
    return (module.startswith("engine.core.") or module == "engine.primitive_ops") \
        and not callable(obj)


def _parts(eng: LLMEngine) -> dict[str, object]:
    """The engine and every part of its bookkeeping it reaches through declared attributes, by
    a name that says where it is (the runtime, config and tokenizer are shared: not walked)."""
    found: dict[str, object] = {"engine": eng}
    todo = [("engine", eng)]
    while todo:
        where, obj = todo.pop()
        for name in (*getattr(type(obj), "PARTS", ()), *getattr(type(obj), "FIXED", ())):
            part = getattr(obj, name)
            if _bookkeeping(part) and all(part is not p for p in found.values()):
                found[f"{where}.{name}"] = part
                todo.append((f"{where}.{name}", part))
    return found


@pytest.mark.parametrize("model", [None, "tiny-random"])
def test_every_attribute_of_the_engine_and_its_parts_is_declared(model):
    """A checkpoint is the sum of declared states: an attribute that is neither state nor fixed
    (shared) nor derived would silently escape it, or pull something into it. Each part that
    holds state says how it is copied (`state` / `load_state`)."""
    config = EngineConfig(model=model, block_size=4, num_gpu_blocks=24, num_cpu_blocks=8,
                          num_offload_blocks=4, device="cpu", dtype="float32",
                          speculative_method="ngram", num_speculative_tokens=2)
    eng = LLMEngine(config)
    for op in OPS:
        eng.apply(op)
    parts = _parts(eng)
    assert {"engine.kv", "engine.kv.pool", "engine.kv.writer", "engine.registry",
            "engine.scheduler", "engine._flight", "engine._primitives"} <= set(parts)
    for where, part in parts.items():
        assert hasattr(type(part), "STATE"), f"{where} ({type(part).__name__}) declares nothing"
        assert undeclared(part) == [], f"{where} ({type(part).__name__}): declare these"
        if type(part).STATE and part is not eng:  # the engine's few values: engine/checkpoint.py
            assert callable(part.state) and callable(part.load_state), where
    eng.scratch = 1  # what a later change might add without declaring it
    assert undeclared(eng) == ["scratch"]


def test_a_sequence_copy_shares_nothing_an_operation_changes():
    """`Sequence.copy` (the registry's state) copies every field that can change in place; a new
    mutable field that it did not copy fails here."""
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=24,
                                 speculative_method="ngram", num_speculative_tokens=2))
    eng.generate(["abcabcabcabc"], SamplingParams(max_tokens=8))
    rid = eng.add_request("abababababab", SamplingParams(max_tokens=20))
    for _ in range(4):
        eng.step()
    seq = eng.request(rid) and next(s for s in eng.seqs.values() if s.request_id == rid)
    assert seq.drafting is not None and seq.output_ids  # a sequence with every field in use
    new = seq.copy()
    assert dataclasses.replace(new, drafting=None) == dataclasses.replace(seq, drafting=None)
    assert vars(new.drafting.index) == vars(seq.drafting.index)
    assert new.drafting.index is not seq.drafting.index
    immutable = (int, float, str, bool, type(None), tuple)
    for f in dataclasses.fields(seq):
        mine, theirs = getattr(seq, f.name), getattr(new, f.name)
        if not isinstance(mine, immutable):
            assert mine is not theirs, f"Sequence.{f.name} is shared by a copy"
    assert all(a is not b for a, b in zip(seq.block_tables, new.block_tables, strict=True))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), at=st.integers(1, 30), swap=st.booleans())
def test_checkpoints_under_async_scheduling_restore_into_another_engine(seed, at, swap):
    """Serving with steps in flight: a checkpoint taken between operations (a step lands first
    where it must) restores into another engine, and the rest equals a replay."""
    config = EngineConfig(model=None, block_size=2, num_gpu_blocks=20, async_scheduling=True,
                          preemption_mode="swap" if swap else "recompute",
                          num_cpu_blocks=16 if swap else 0, seed=seed % 4)
    r = random.Random(seed)
    script = []
    for i in range(40):
        if r.random() < 0.3:
            script.append(ops.AddRequest("ab" * r.randint(1, 5) + str(i),
                                         SamplingParams(max_tokens=r.randint(1, 9),
                                                        n=r.choice([1, 2]), temperature=0.8)))
        script.append(ops.Step())
    eng = LLMEngine(config)
    for op in script[:at]:
        eng.apply(op)
    cp = eng.checkpoint()
    if cp is None:  # a step in flight: a primitive op lands it (as the page's would)
        eng.apply(ops.SetPrefixCaching(True))
        cp = eng.checkpoint()
    assert cp is not None
    other = LLMEngine(config)
    other.restore(cp)
    for op in script[at:]:
        other.apply(op)
        other.check_invariants()
    assert state(other) == state(LLMEngine.replay(config, other.trace))


def test_a_checkpoint_without_the_content_shadow_is_refused_where_one_is_kept(monkeypatch):
    config = EngineConfig(model=None, block_size=4, num_gpu_blocks=24)
    monkeypatch.delenv("PAGEDLAB_TRACK_KV_CONTENT")  # the product: no shadow
    plain = LLMEngine(config)
    plain.apply(ops.AddSequence("abcdefgh"))
    cp = plain.checkpoint()
    monkeypatch.setenv("PAGEDLAB_TRACK_KV_CONTENT", "1")
    tracked = LLMEngine(config)
    with pytest.raises(ValueError, match="holds no state for content"):
        tracked.restore(cp)
    assert tracked.trace == []
