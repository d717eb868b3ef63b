"""When a block's K/V go to the CPU tier (EngineConfig.tier_store): "computed" stores a block as
soon as it is full and hashed, its copy queued after the pass that computes it (vLLM's
offloading connector), so that the pool's eviction later copies nothing; "evicted" (the default,
lesson 14's) copies it as the pool evicts it. The dry engine's shadow of every KV slot and tier
slot (engine/core/kv_content.py, checked after each operation) proves the copies' order on
content; tests/engine/test_offload_tier.py compares real bytes and tokens in both modes."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.describe.narration import narrate

ONE = SamplingParams(max_tokens=1, ignore_eos=True)
DOC = "the tier keeps a prefix that the pool let go of; "  # 12 full blocks of 4


def _engine(store: str, **kw) -> LLMEngine:
    cfg = dict(model=None, block_size=4, num_gpu_blocks=40, num_offload_blocks=64,
               track_kv_content=True, tier_store=store)
    return LLMEngine(EngineConfig(**{**cfg, **kw}))


def _kinds(events, kind: str) -> list:
    return [e for e in events if e.kind == kind]


def _cycle(eng: LLMEngine) -> list:
    """The document, a filler that evicts it, the document again: the last request's events."""
    eng.generate(DOC + "one", ONE)
    eng.generate("a filler that takes the whole pool. " * 4, ONE)  # 36 of the 40 blocks
    rid = eng.add_request(DOC + "two", ONE)
    events = []
    while eng.has_pending_work():
        events += eng.step().events
        eng.check_invariants()
    assert rid in {o.request_id for o in eng.finished_requests()}
    return events


def test_a_computed_block_is_in_the_tier_before_any_eviction() -> None:
    eng = _engine("computed")
    seq = eng.add_sequence(DOC)
    snap = eng.snapshot()
    full = [b for b in eng.block_table(seq) if snap.blocks[b].num_filled == 4]
    stored = _kinds(eng.last_events, "offload")
    assert [e.block_ids[0] for e in stored] == full  # every full block, at once
    assert all("once computed" in narrate(e) for e in stored)
    assert {t.block_hash for t in snap.tier_blocks if t.block_hash} == \
        {snap.blocks[b].block_hash for b in full}
    assert snap.metrics.evictions == 0


def test_the_pool_evicts_a_computed_block_without_a_copy_and_loads_it_back() -> None:
    eng = _engine("computed")
    events = _cycle(eng)
    assert _kinds(events, "load")  # the document came back from the tier
    evicted = {b for e in _kinds(events, "evict") for b in e.block_ids}
    assert evicted  # the pool made room...
    offloaded = [e for e in _kinds(events, "offload") if e.facts.evicted]
    assert not offloaded  # ...and every block it let go was in the tier already


def test_both_modes_load_the_same_blocks_and_store_computed_copies_fewer_at_eviction() -> None:
    by = {store: _cycle(_engine(store)) for store in ("evicted", "computed")}
    loads = {s: [e.facts.tokens for e in _kinds(ev, "load")] for s, ev in by.items()}
    assert loads["evicted"] == loads["computed"] and loads["evicted"]
    at_eviction = {s: sum(e.facts.evicted for e in _kinds(ev, "offload")) for s, ev in by.items()}
    assert at_eviction["evicted"] > 0 and at_eviction["computed"] == 0


def test_a_tier_smaller_than_a_step_keeps_only_stores_it_still_holds() -> None:
    """Four slots, prompts of many blocks: a store waiting for its pass loses its slot to an
    eviction of the same step. Dropped with its event; the shadow checks every slot's bytes."""
    eng = _engine("computed", block_size=3, num_gpu_blocks=6, num_offload_blocks=4,
                  max_num_batched_tokens=16)
    for prompt, params in (("a", SamplingParams(max_tokens=1, beam_width=2)),  # hypothesis's
                           ("aa", SamplingParams(max_tokens=5, temperature=0.0, n=3)),
                           ("aaaaa", SamplingParams(max_tokens=3, temperature=0.0)),
                           ("tutor: a", SamplingParams(max_tokens=1, beam_width=2))):
        eng.add_request(prompt, params)
    told = 0
    while eng.has_pending_work():
        events = eng.step().events
        eng.check_invariants()  # every tier slot holds the K/V of its entry's tokens
        offloads = _kinds(events, "offload")
        told += len(offloads)
        assert eng.snapshot().metrics.offloaded_blocks == told  # a dropped store is not counted
        for i, e in enumerate(offloads):  # no event tells of a store an eviction overtook
            if not e.facts.evicted:
                assert not any(o.facts.evicted and o.facts.slot == e.facts.slot
                               for o in offloads[i + 1:]), [narrate(o) for o in offloads]


def test_stores_are_made_before_the_operation_ends_under_async_scheduling() -> None:
    eng = _engine("computed", async_scheduling=True)
    _cycle(eng)
    assert eng.kv.take_stores() == []


@pytest.mark.parametrize("bad", ["", "always", None, 1])
def test_a_nonsense_tier_store_is_refused_with_the_choices(bad) -> None:
    with pytest.raises(ValueError, match="tier_store must be one of 'evicted', 'computed'"):
        EngineConfig(model=None, num_offload_blocks=4, tier_store=bad)
