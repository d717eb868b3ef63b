"""Serving (add_request / step), at random, on pools small enough to preempt and refuse: with or
without prefix caching, the CPU tier, swap space, a hybrid's sliding group, async scheduling.
The primitives' state machine (tests/engine/core/test_state_machine.py) does this for add /
append / fork / free; this is its serving side.

Every step keeps the invariants; a refused request changes nothing (the pool too small for it);
the run ends with every request finished and no block used; replaying the op log rebuilds the
same state, bit for bit.
"""

import hypothesis.strategies as st
from hypothesis import given, settings

from engine import EngineConfig, LLMEngine, OutOfBlocks, SamplingParams
from tests.helpers import fingerprint


def _config(data: st.DataObject) -> EngineConfig:
    window = data.draw(st.sampled_from([None, None, 2, 5]), label="window")
    tier = 0 if window else data.draw(st.sampled_from([0, 2, 4, 8]), label="tier")
    return EngineConfig(
        model=None, block_size=data.draw(st.sampled_from([1, 2, 4]), label="block_size"),
        num_gpu_blocks=data.draw(st.integers(2, 16), label="blocks"), num_offload_blocks=tier,
        tier_store=data.draw(st.sampled_from(["evicted", "computed"]), label="tier_store"),
        sliding_window=window, num_cpu_blocks=data.draw(st.sampled_from([0, 8]), label="swap"),
        enable_prefix_caching=data.draw(st.booleans(), label="prefix"),
        max_num_batched_tokens=data.draw(st.sampled_from([4, 8, 64]), label="budget"),
        max_num_seqs=data.draw(st.integers(1, 4), label="seqs"),
        async_scheduling=data.draw(st.booleans(), label="async"), seed=0)


def _request(data: st.DataObject) -> tuple[list[int], SamplingParams]:
    # a tiny vocabulary makes shared prefixes, and so prefix and tier hits, likely
    prompt = data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=12), label="prompt")
    params = SamplingParams(max_tokens=data.draw(st.integers(1, 6), label="max_tokens"),
                            temperature=data.draw(st.sampled_from([0.0, 1.0]), label="t"),
                            ignore_eos=True)
    return prompt, params


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_serving_at_random_keeps_every_invariant_and_replays(data: st.DataObject) -> None:
    cfg = _config(data)
    eng = LLMEngine(cfg)
    for _ in range(data.draw(st.integers(1, 25), label="actions")):
        if data.draw(st.booleans(), label="add"):
            prompt, params = _request(data)
            before, logged = fingerprint(eng), len(eng.trace)
            try:
                eng.add_request(prompt, params)
            except (OutOfBlocks, ValueError):
                assert fingerprint(eng) == before and len(eng.trace) == logged
        elif eng.has_pending_work():
            eng.step()
        eng.check_invariants()
    while eng.has_pending_work():
        eng.step()
        eng.check_invariants()
    assert eng.snapshot().metrics.used_blocks == 0
    assert fingerprint(LLMEngine.replay(cfg, eng.trace)) == fingerprint(eng)
