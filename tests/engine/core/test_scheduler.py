"""Continuous batching in dry mode: FCFS, budgets, preemption all or nothing, resume order."""

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.describe.narration import narrate


def dry(num_blocks=32, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=num_blocks, **kw))


def run_all(eng: LLMEngine) -> tuple[list, set[str]]:
    finished, kinds = [], set()
    for _ in range(500):
        if not eng.scheduler.has_work():
            break
        result = eng.step()
        eng.check_invariants()
        finished += result.finished
        kinds |= {e.kind for e in result.events}
    return finished, kinds


def test_requests_added_between_steps_join_the_next_step_and_finish_in_fcfs_order():
    eng = dry()
    a = eng.add_request("first", SamplingParams(max_tokens=3))
    r = eng.step()
    assert r.num_prefills == 1 and r.num_decodes == 0
    b = eng.add_request("second", SamplingParams(max_tokens=3))
    r = eng.step()
    assert r.num_prefills == 1 and r.num_decodes == 1  # prefill and decode share the step
    finished, _ = run_all(eng)
    assert [o.request_id for o in finished] == [a, b]
    assert all(len(o.outputs[0].token_ids) == 3 for o in finished)
    assert eng.snapshot().metrics.used_blocks == 0


def test_token_budget_limits_prefills_per_step_without_chunking():
    eng = dry(max_num_batched_tokens=12, enable_chunked_prefill=False)
    for _ in range(3):
        eng.add_request("x" * 10, SamplingParams(max_tokens=2))
    r = eng.step()
    assert r.num_prefills == 1  # a second 10-token prompt would exceed 12 tokens
    assert eng.snapshot().metrics.extra["requests_waiting"] == 2


def test_chunked_prefill_fills_the_token_budget_and_finishes_the_prompt_later():
    eng = dry(max_num_batched_tokens=12, enable_prefix_caching=False)
    for c in "xyz":
        eng.add_request(c * 10, SamplingParams(max_tokens=2))
    r = eng.step()
    eng.check_invariants()
    # the first prompt whole, the first 2 tokens of the second; the third waits
    assert (r.num_prefills, r.num_batched_tokens) == (2, 12)
    second = eng.seqs[1]
    assert second.num_tokens == 2 and len(second.prefill_rest) == 8 and not second.output_ids
    assert any("chunked prefill: tokens 0–1 of 10" in narrate(e) for e in r.events)
    assert eng.snapshot().metrics.extra["requests_waiting"] == 1
    finished, _ = run_all(eng)
    assert sorted(o.request_id for o in finished) == [0, 1, 2]
    assert all(len(o.outputs[0].token_ids) == 2 for o in finished)


def test_a_long_prompt_is_chunked_beside_running_decodes_and_never_overruns_the_budget():
    eng = dry(num_blocks=64, max_num_batched_tokens=8, enable_prefix_caching=False)
    for c in "ab":
        eng.add_request(c * 3, SamplingParams(max_tokens=30))
    eng.step()
    long_id = eng.add_request("L" * 40, SamplingParams(max_tokens=3))
    steps = []
    while eng.scheduler.has_work():
        r = eng.step()
        eng.check_invariants()
        steps.append(r)
        if any(o.request_id == long_id for o in r.finished):
            break
    assert all(r.num_batched_tokens <= 8 for r in steps)
    assert all(r.num_decodes >= 2 for r in steps[:6])  # the decodes never stop for it
    # 40 prompt tokens, 6 a step beside the 2 decodes: its first token after 7 steps, not 30
    assert len(steps) < 12


def test_without_chunking_a_long_prompt_waits_for_the_running_decodes():
    eng = dry(num_blocks=64, max_num_batched_tokens=8, enable_prefix_caching=False,
              enable_chunked_prefill=False)
    for c in "ab":
        eng.add_request(c * 3, SamplingParams(max_tokens=30))
    eng.step()
    eng.add_request("L" * 40, SamplingParams(max_tokens=3))
    r = eng.step()
    assert r.num_prefills == 0 and eng.snapshot().metrics.extra["requests_waiting"] == 1


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preempting_a_sequence_mid_prefill_keeps_its_whole_prompt(mode):
    eng = dry(num_blocks=12, max_num_batched_tokens=6, preemption_mode=mode,
              num_cpu_blocks=16, enable_prefix_caching=False)
    eng.add_request("a" * 5, SamplingParams(max_tokens=30))
    eng.step()
    eng.add_request("b" * 30, SamplingParams(max_tokens=4))
    finished, kinds = run_all(eng)
    assert "preempt" in kinds
    assert sorted(o.request_id for o in finished) == [0, 1]
    assert [len(o.outputs[0].token_ids) for o in sorted(finished, key=lambda o: o.request_id)] == [30, 4]
    assert eng.snapshot().metrics.used_blocks == 0


def test_sequence_budget_counts_the_whole_group():
    eng = dry(max_num_seqs=4)
    eng.add_request("aaaa", SamplingParams(max_tokens=4, n=3, temperature=1.0))
    eng.add_request("bbbb", SamplingParams(max_tokens=4, n=3, temperature=1.0))
    eng.step()
    assert eng.snapshot().metrics.extra["requests_running"] == 1


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_out_of_blocks_preempts_the_latest_arrival_all_or_nothing(mode):
    eng = dry(num_blocks=8, preemption_mode=mode, num_cpu_blocks=16)
    first = eng.add_request("a" * 6, SamplingParams(max_tokens=12))
    eng.add_request("b" * 6, SamplingParams(max_tokens=12, n=2, temperature=1.0))
    preempted, kinds = [], set()
    while eng.scheduler.has_work():
        r = eng.step()
        eng.check_invariants()
        kinds |= {e.kind for e in r.events}
        preempted += [e for e in r.events if e.kind == "preempt"]
    assert preempted and all("request 1" in narrate(e) for e in preempted)  # never the older one
    assert eng.snapshot().metrics.extra["preemptions"] == len(preempted)
    if mode == "swap":
        assert {"swap_out", "swap_in"} <= kinds
    assert first == 0


def test_swap_falls_back_to_recompute_when_the_cpu_pool_is_full():
    eng = dry(num_blocks=8, preemption_mode="swap", num_cpu_blocks=1)
    eng.add_request("a" * 6, SamplingParams(max_tokens=12))
    eng.add_request("b" * 6, SamplingParams(max_tokens=12))
    finished, kinds = run_all(eng)
    assert "preempt" in kinds and "swap_out" not in kinds
    assert sorted(o.request_id for o in finished) == [0, 1]


def test_a_request_too_big_for_the_whole_pool_is_aborted_with_a_reason():
    eng = dry(num_blocks=3)
    eng.add_request("abcd", SamplingParams(max_tokens=8))  # 12 tokens: exactly the 3 blocks
    # each sample alone fits, but four of them never can
    eng.add_request("efgh", SamplingParams(max_tokens=8, n=4, temperature=1.0))
    finished, _ = run_all(eng)
    reasons = {o.request_id: o.outputs[0].finish_reason if o.outputs else None for o in finished}
    assert reasons[0] == "length"
    aborted = [o for o in finished if o.request_id == 1]
    assert aborted and aborted[0].outputs[0].finish_reason == "abort"
    assert eng.snapshot().metrics.used_blocks == 0


def test_parallel_sampling_reports_the_sharing_saving():
    eng = dry(num_blocks=64)
    eng.add_request("s" * 30, SamplingParams(max_tokens=4, n=4, temperature=1.0))
    eng.step()
    m = eng.snapshot().metrics
    assert m.logical_blocks == 4 * 8 and m.used_blocks == 8
    assert m.sharing_saving_fraction == pytest.approx(0.75)


def test_add_request_rejects_what_can_never_run():
    eng = dry(num_blocks=4)
    with pytest.raises(ValueError, match="exceeds the 16 tokens"):
        eng.add_request("x" * 10, SamplingParams(max_tokens=10))
    with pytest.raises(ValueError, match="max_tokens must be"):
        eng.add_request("x", SamplingParams(max_tokens=0))
    with pytest.raises(ValueError, match="params must be a SamplingParams"):
        eng.add_request("x", {"max_tokens": 3})
    assert eng.trace == []


def test_serving_replays_to_the_same_state():
    eng = dry(num_blocks=10, preemption_mode="swap", num_cpu_blocks=8)
    eng.add_request("alpha beta", SamplingParams(max_tokens=6, n=2, temperature=0.7))
    eng.add_request("gamma", SamplingParams(max_tokens=5, beam_width=2))
    for _ in range(4):
        eng.step()
    from tests.helpers import fingerprint

    assert fingerprint(LLMEngine.replay(eng.config, eng.trace)) == fingerprint(eng)


def test_a_sequence_resumed_by_recompute_keeps_its_prompt_length():
    eng = dry(num_blocks=8, preemption_mode="recompute")
    eng.add_request("a" * 6, SamplingParams(max_tokens=12))
    eng.add_request("b" * 6, SamplingParams(max_tokens=12, n=2, temperature=1.0))
    resumed = False
    while eng.scheduler.has_work():
        result = eng.step()
        resumed |= any("recompute after preemption" in narrate(e) for e in result.events)
        assert {s.prompt_len for s in eng.snapshot().sequences.values()} <= {6}
    assert resumed  # the case under test happened


def test_freeing_every_sequence_of_a_running_request_ends_it_and_the_engine_goes_on():
    """The Free primitive on a request's sequences (here both beams): once none is left, the
    request ends as aborted, the next step reports it, and the engine keeps stepping."""
    eng = LLMEngine(EngineConfig(model=None, block_size=2, num_gpu_blocks=4,
                                 enable_prefix_caching=False, max_num_batched_tokens=3))
    rid = eng.add_request("ab", SamplingParams(max_tokens=2, beam_width=2))
    eng.step()
    for seq in list(eng.seqs):
        eng.free(seq)
        eng.check_invariants()
    result = eng.step()
    assert [(o.request_id, o.finished) for o in result.finished] == [(rid, True)]
    assert {c.finish_reason for c in result.finished[0].outputs} <= {"abort"}
    assert not eng.has_pending_work() and eng.snapshot().metrics.used_blocks == 0
    eng.check_invariants()
    assert LLMEngine.replay(eng.config, eng.trace).snapshot() == eng.snapshot()


def test_swapped_out_requests_are_no_sharing_saving():
    """Issue 42, item 5: a swapped-out request's table points at CPU blocks. Counted among the
    table entries that GPU blocks back, it showed as "saved by sharing" where nothing is shared.
    The saving is every GPU block's references beyond the first, at every step."""
    eng = dry(num_blocks=8, preemption_mode="swap", num_cpu_blocks=16)
    eng.add_request("a" * 6, SamplingParams(max_tokens=12))
    eng.add_request("b" * 6, SamplingParams(max_tokens=12))
    swapped_steps = 0
    while eng.scheduler.has_work():
        eng.step()
        snap = eng.snapshot()
        shared = sum(b.ref_count - 1 for b in snap.blocks if b.ref_count > 1)
        swapped_steps += any(s.status == "swapped" for s in snap.sequences.values())
        assert snap.metrics.shared_saving == shared == 0, snap.step
    assert swapped_steps  # the run did swap a request out
