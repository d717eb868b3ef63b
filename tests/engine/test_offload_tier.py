"""The prefix cache's CPU tier (EngineConfig.num_offload_blocks): a cached block evicted from a
small GPU pool keeps its K/V in CPU memory; a later prompt with that prefix copies it back (a
real copy: the bytes equal those computed the first time) and prefills only the rest, with the
same tokens as an engine that recomputes it."""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, OutOfBlocks, SamplingParams
from engine.core.offload_tier import OffloadTier
from engine.describe.narration import narrate

SYSTEM = "You are a helpful assistant who answers questions about geography in one short sentence. "
FILLERS = ["Once upon a time there was a dragon who lived in a cave by the sea and guarded gold",
           "The history of the bicycle begins in the early nineteenth century when inventors"]
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


def _serve(eng: LLMEngine) -> tuple[list, list]:
    """A system-prompt request, two others that push its blocks out, then the system prompt
    again; returns the outputs and the last request's events."""
    outs = [eng.generate(SYSTEM + "What is the capital of France?", PARAMS)[0]]
    outs += [eng.generate(f, PARAMS)[0] for f in FILLERS]
    events = []
    rid = eng.add_request(SYSTEM + "What is the capital of Spain?", PARAMS)
    while not any(o.request_id == rid for o in outs):
        res = eng.step()
        events += res.events
        outs += res.finished
        eng.check_invariants()
    return [o.outputs[0].token_ids for o in outs], events


@pytest.mark.model
@pytest.mark.parametrize("store", ["evicted", "computed"])
def test_an_evicted_prefix_comes_back_from_the_tier(default_model, store) -> None:
    """`store`: when a block's K/V go to the tier (EngineConfig.tier_store), as the pool evicts
    it or as soon as it is computed; either way its bytes come back as computed."""
    cfg = dict(model="default", device="cpu", dtype="float32", block_size=4, num_gpu_blocks=12,
               track_kv_content=True)
    plain, plain_events = _serve(LLMEngine(EngineConfig(**cfg)))
    eng = LLMEngine(EngineConfig(**cfg, num_offload_blocks=32, tier_store=store))
    # the system prompt's full blocks as computed the first time, by their tokens
    first = eng.add_sequence(SYSTEM)
    snap = eng.snapshot()
    computed_kv = {tuple(snap.blocks[b].token_ids): eng.inspect_block(b, 3)
                   for b in eng.block_table(first) if snap.blocks[b].num_filled == 4}
    eng.free(first)
    got, events = _serve(eng)
    assert got == plain  # the same tokens as recomputing the prefix
    m = eng.snapshot().metrics
    assert m.offloaded_blocks > 0 and m.offload_hit_blocks > 0
    loads = [e for e in events if e.kind == "load"]
    assert loads and "found in the CPU tier" in narrate(loads[0])
    computed = next(e for e in events if e.kind == "prefill").facts.computed
    plain_computed = next(e for e in plain_events if e.kind == "prefill").facts.computed
    assert computed <= plain_computed - 4 * len(loads[0].block_ids)  # the rest only
    snap = eng.snapshot()
    compared = 0
    for b in loads[0].block_ids:  # a real copy: the bytes computed the first time
        k, v = computed_kv.get(tuple(snap.blocks[b].token_ids), (None, None))
        if k is not None:
            k2, v2 = eng.inspect_block(b, 3)
            assert torch.equal(k, k2) and torch.equal(v, v2)
            compared += 1
    assert compared > 0


def test_the_tier_is_least_recently_used_and_keeps_pinned_slots() -> None:
    tier = OffloadTier(2)
    assert tier.store(10, [1, 2]) == 0 and tier.store(11, [3, 4]) == 1
    assert tier.store(10, [1, 2]) is None  # held already: only freshened
    assert tier.find(10, [1, 2]) == 0 and tier.find(10, [9, 9]) is None  # tokens must match
    assert tier.store(12, [5, 6]) == 1  # 11 was the least recently used
    assert tier.find(11, [3, 4]) is None
    assert tier.store(13, [7, 8], pinned={0, 1}) is None  # both slots read by loads this step
    assert tier.check() is None and tier.offloaded_blocks == 3


def test_a_loads_bus_copy_is_asked_for_before_the_blocks_it_evicts_are_offloaded(monkeypatch) -> None:
    """A prefix evicted into the tier and asked again by a prompt that fills the pool: its step
    evicts other cached blocks into the tier for the blocks it loads into. The runtime hears the
    load's slots (`fetch_ahead`) as soon as the bookkeeping has chosen them, before it evicts
    for them (so the bus runs beside the rest of the schedule), and they are exactly the slots
    the step then loads (dry engine: the copies are the runtime's calls, in order)."""
    from engine.dry.dry_runtime import DryRuntime

    calls: list[tuple[str, list[int]]] = []
    evicted_at_fetch: list[int] = []  # the bookkeeping's evictions so far, at each fetch

    def recorded(kind: str):
        real = getattr(DryRuntime, kind)

        def record(self, arg):  # the slots each call reads or writes, then the real call
            calls.append((kind, [a if isinstance(a, int) else a[0 if kind == "load" else 1]
                                 for a in arg]))
            if kind == "fetch_ahead":
                evicted_at_fetch.append(eng.kv.writer.evictions)
            return real(self, arg)
        return record

    for kind in ("fetch_ahead", "offload", "load"):
        monkeypatch.setattr(DryRuntime, kind, recorded(kind))
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=12, num_offload_blocks=16))
    doc, other = list(range(40, 72)), list(range(100, 140))  # 8 and 10 blocks
    once = SamplingParams(max_tokens=1, ignore_eos=True)
    eng.generate([doc], once)
    eng.generate([other], once)  # takes the pool: the document's blocks go to the tier
    calls.clear()
    evicted_at_fetch.clear()
    before = eng.kv.writer.evictions
    eng.add_request(doc[:28] + [1, 2, 3, 4, 5], once)  # its first 7 blocks from the tier
    res = eng.step()
    assert evicted_at_fetch == [before]  # asked once, before the step evicted anything
    assert eng.kv.writer.evictions > before  # and the step did evict
    eng.check_invariants()
    kinds = [kind for kind, _ in calls]
    assert kinds[0] == "fetch_ahead" and "offload" in kinds, calls  # the other's blocks evicted
    fetched = {s for kind, slots in calls if kind == "fetch_ahead" for s in slots}
    loaded = {s for kind, slots in calls if kind == "load" for s in slots}
    assert loaded and fetched == loaded
    assert {s for e in res.events if e.kind == "load" for s in e.facts.slots} == loaded


def test_a_refused_prompt_leaves_the_tiers_order_as_it_was() -> None:
    """Found by the state machine (tests/engine/core/test_state_machine.py): a prompt whose
    first block the tier holds, refused because the pool cannot give its other blocks, used to
    make that block the tier's most recent anyway; the refusal must change nothing, and the
    replayed log (which has no refused operation) must rebuild the same state."""
    from tests.helpers import fingerprint

    cfg = EngineConfig(model=None, block_size=1, num_gpu_blocks=3, enable_prefix_caching=True,
                       num_offload_blocks=3)
    eng = LLMEngine(cfg)
    eng.add_sequence([0])
    eng.add_sequence([0, 0])
    eng.add_sequence([0])
    eng.free(1)  # its second block, [0, 0], is cached; taking it later offloads it to the tier
    eng.add_sequence([0])
    eng.free(0)
    eng.add_sequence([0])
    assert [slot for slot in eng.snapshot().tier_lru] == [0, 1]
    before = fingerprint(eng)
    with pytest.raises(OutOfBlocks, match="needs 2 free block"):
        eng.add_sequence([0, 0, 0])  # its block [0, 0] is a tier hit (slot 0); nothing is free
    assert fingerprint(eng) == before
    assert fingerprint(LLMEngine.replay(cfg, eng.trace)) == fingerprint(eng)
    eng.check_invariants()
