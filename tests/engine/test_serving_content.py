"""Serving under load, checked on content: requests arrive a few before each step (not all at
once: that is what made a swap-in and a swap-out meet in one step, issue 36) into pools, swap
spaces and block sizes drawn at random, with prefix caching, chunked prefill, both preemption
modes, samples and beams, sliding windows, the CPU tier, drafts and async scheduling drawn too.

The dry engine's shadow of the KV slots (engine/core/kv_content.py) is checked after every
operation and in full after every step: each sequence's tables must read back its own tokens'
K/V. The dry mode's outputs come from an RNG that never reads K/V, so comparing outputs could
not see a wrong copy; the shadow does."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from engine import EngineConfig, LLMEngine, SamplingParams

params = st.one_of(
    st.builds(lambda m, t, n: SamplingParams(max_tokens=m, temperature=t, n=n),
              st.integers(1, 10), st.sampled_from([0.0, 0.8]), st.sampled_from([1, 1, 2, 3])),
    st.builds(lambda m, w: SamplingParams(max_tokens=m, beam_width=w),
              st.integers(1, 8), st.sampled_from([2, 3])),
)
# a small alphabet and a shared opening make prefix hits likely
prompts = st.builds(lambda shared, rest: ("tutor: " if shared else "") + rest,
                    st.booleans(), st.text("ab", min_size=1, max_size=20))
arrivals = st.lists(st.lists(st.tuples(prompts, params), max_size=4), min_size=1, max_size=8)


@st.composite
def configs(draw) -> EngineConfig:
    window = draw(st.sampled_from([None, None, None, 3, 9]))
    swap = draw(st.booleans())
    drafts = draw(st.booleans())
    return EngineConfig(
        model=None, block_size=draw(st.integers(1, 8)), num_gpu_blocks=draw(st.integers(6, 40)),
        num_cpu_blocks=draw(st.integers(0, 12)) if swap else 0,
        preemption_mode="swap" if swap else "recompute",
        enable_prefix_caching=draw(st.booleans()),
        enable_chunked_prefill=draw(st.booleans()),
        max_num_batched_tokens=draw(st.sampled_from([5, 16, 2048])),
        num_offload_blocks=0 if window else draw(st.sampled_from([0, 0, 4])),
        tier_store=draw(st.sampled_from(["evicted", "computed"])),
        sliding_window=window, async_scheduling=draw(st.booleans()),
        speculative_method="ngram" if drafts else None, num_speculative_tokens=2 if drafts else 0,
        seed=draw(st.integers(0, 3)))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs(), work=arrivals)
def test_every_sequence_reads_back_its_own_kv_whatever_arrives_when(cfg, work):
    eng = LLMEngine(cfg)
    assert eng.content is not None  # tracked in the dry mode: checked after every operation
    ids, offered = [], 0
    for batch in work + [[]] * 400:
        for prompt, p in batch:
            offered += 1
            try:
                ids.append(eng.add_request(prompt, p))
            except ValueError as e:  # could never fit this engine: refused when added
                assert "this engine can hold" in str(e) or "blocks" in str(e)
        if not eng.has_pending_work() and offered == sum(map(len, work)):
            break
        eng.step()
        eng.check_invariants()  # every sequence, cached block and tier slot, in full
    assert not eng.has_pending_work()
    done = {o.request_id for o in eng.finished_requests()}
    assert done == set(ids)
    assert eng.snapshot().metrics.used_blocks == 0


def test_a_request_preempted_while_its_blocks_came_from_the_tier_prefills_when_it_returns():
    """Found by the test above: a sequence whose prefix blocks came back from the CPU tier
    (`loading`: it computes the rest of its prompt next step) was preempted by recompute first;
    admitted again without a load, it still said `loading`, so its new blocks were hashed into
    the prefix cache and never computed."""
    cfg = EngineConfig(model=None, block_size=2, num_gpu_blocks=16, max_num_batched_tokens=16,
                       num_offload_blocks=4)
    eng = LLMEngine(cfg)
    for prompt, p in [("a", SamplingParams(max_tokens=3)),
                      ("a", SamplingParams(max_tokens=1, beam_width=2)),
                      ("tutor: aaaaaaaaaaaaaaaaa", SamplingParams(max_tokens=2, n=3)),
                      ("aaaaaa", SamplingParams(max_tokens=1, beam_width=2))]:
        eng.add_request(prompt, p)
    preempted = loaded = False
    while eng.has_pending_work():
        events = eng.step().events
        preempted |= any(e.kind == "preempt" for e in events)
        loaded |= any(e.kind == "load" for e in events)
        eng.check_invariants()
    assert preempted and loaded  # the case this test is about
    assert len(eng.finished_requests()) == 4
