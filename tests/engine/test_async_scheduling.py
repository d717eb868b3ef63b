"""Async scheduling (EngineConfig.async_scheduling): step t + 1 is scheduled and launched
before step t's tokens are read back. The outputs must be exactly those of the plain engine,
whatever the workload; the invariants hold after every step; finished requests come one step
later at most."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from engine import EngineConfig, LLMEngine, SamplingParams


def run(eng: LLMEngine, work: list[tuple[object, SamplingParams]], check: bool = True) -> dict:
    ids = [eng.add_request(p, sp) for p, sp in work]
    done: dict[int, list] = {}
    for _ in range(2000):
        if not eng.scheduler.has_work() and eng._flight.launched is None:
            break
        result = eng.step()
        if check:
            eng.check_invariants()
        for o in result.finished:
            done[o.request_id] = [(c.token_ids, c.finish_reason) for c in o.outputs]
    assert sorted(done) == sorted(ids)
    assert eng.snapshot().metrics.used_blocks == 0
    return done


def same_outputs(a: dict, b: dict) -> bool:
    """Outputs equal, request by request, except where either run aborted the request: an abort
    (a group that outgrew the whole pool, e.g. n samples re-prefilled apart after a preemption)
    comes when the pool runs out, which a step in flight or a draft moves."""
    aborted = {r for run_ in (a, b) for r, outs in run_.items() if any(f == "abort" for _, f in outs)}
    return a.keys() == b.keys() and all(a[r] == b[r] for r in a if r not in aborted)


def dry_sampling(max_tokens: int, n: list[int]) -> st.SearchStrategy[SamplingParams]:
    """Greedy or sampled (n of them), with or without a stop string, seeded or not. No beams:
    the dry mode draws beam candidates from one RNG shared by the batch, so they depend on which
    steps the groups share (the real-model test has beams)."""
    return st.builds(lambda m, t, k, stop, seed: SamplingParams(
        max_tokens=m, temperature=t, n=k, stop=("q",) if stop else (), seed=seed),
        st.integers(1, max_tokens), st.sampled_from([0.0, 0.8]), st.sampled_from(n),
        st.booleans(), st.integers(0, 3))


requests = st.lists(st.tuples(st.text("abcdef", min_size=1, max_size=30),
                              dry_sampling(12, [1, 1, 3])), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(work=requests, blocks=st.integers(12, 40), budget=st.sampled_from([5, 16, 2048]),
       swap=st.booleans(), prefix=st.booleans(), window=st.sampled_from([None, 3, 9]))
def test_dry_async_scheduling_changes_no_output(work, blocks, budget, swap, prefix, window):
    """Async against plain steps, with one block table or a hybrid's two (full and sliding)."""
    def engine(async_scheduling: bool, sliding_window: int | None) -> LLMEngine:
        return LLMEngine(EngineConfig(
            model=None, block_size=4, num_gpu_blocks=blocks, max_num_batched_tokens=budget,
            preemption_mode="swap" if swap else "recompute", num_cpu_blocks=64 if swap else 0,
            enable_prefix_caching=prefix, async_scheduling=async_scheduling,
            sliding_window=sliding_window))

    assert same_outputs(run(engine(True, window), work), run(engine(False, window), work))


def test_dry_async_steps_overlap_and_stop_strings_land_a_step_late():
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=64, async_scheduling=True))
    eng.add_request("abc", SamplingParams(max_tokens=40, stop=("q",), temperature=1.0, seed=1))
    eng.add_request("abd", SamplingParams(max_tokens=9))
    overlapped = 0
    while eng.scheduler.has_work():
        eng.step()
        overlapped += eng._flight.launched is not None
        eng.check_invariants()
    assert overlapped >= 5
    sync = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=64))
    outs = sync.generate(["abc", "abd"], SamplingParams(max_tokens=40, stop=("q",), temperature=1.0,
                                                        seed=1))
    assert outs[0].outputs[0].finish_reason in ("stop", "length")


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))])
def test_real_async_scheduling_changes_no_output(tiny_model, device):
    """On a GPU the decode steps are CUDA graph replays whose inputs read the last step's
    picks on the device, from two pinned input buffers used in turn."""
    prompts = [list(range(300 + 7 * i, 300 + 7 * i + 5 + 3 * i)) for i in range(6)]
    shared = list(range(50, 70))
    work = [(p, SamplingParams(max_tokens=6 + i, ignore_eos=i % 2 == 0)) for i, p in enumerate(prompts)]
    work += [(shared + p, SamplingParams(max_tokens=7, temperature=0.9, seed=i, top_k=50))
             for i, p in enumerate(prompts[:3])]
    work += [(p, SamplingParams(max_tokens=5, n=3, temperature=1.0, seed=5)) for p in prompts[:2]]
    work += [(p, SamplingParams(max_tokens=5, beam_width=2)) for p in prompts[2:4]]
    work += [(prompts[5], SamplingParams(max_tokens=4, n=2))]  # greedy n = 2: two equal copies
    work += [(p, SamplingParams(max_tokens=6, temperature=0.7, top_p=0.9, seed=2)) for p in prompts[4:]]

    def engine(async_scheduling: bool, blocks: int) -> LLMEngine:
        return LLMEngine(EngineConfig(model="tiny-random", device=device, dtype="float32",
                                      block_size=4, num_gpu_blocks=blocks, max_num_batched_tokens=24,
                                      async_scheduling=async_scheduling))

    expected = run(engine(False, 256), work)
    assert run(engine(True, 256), work) == expected
    assert run(engine(True, 30), work) == expected  # a small pool: preemption, drained first


def test_a_primitive_lands_the_step_in_flight_and_the_next_step_reports_it():
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=64, async_scheduling=True))
    rid = eng.add_request("abc", SamplingParams(max_tokens=3))
    eng.step()
    eng.step()
    assert eng._flight.launched is not None
    # between calls every slot holds a real token (the step before landed inside the call);
    # the token of the step on its way is not an output yet
    assert all(t >= 0 for t in eng.snapshot().sequences[0].token_ids)
    assert len(eng.seqs[0].output_ids) == 1
    seq = eng.add_sequence("zz")  # lands the step first
    assert eng._flight.launched is None and len(eng.seqs[0].output_ids) == 2
    eng.check_invariants()
    finished = []
    while eng.scheduler.has_work() or eng._flight.launched is not None:
        finished += eng.step().finished
    assert [o.request_id for o in finished] == [rid] and len(finished[0].outputs[0].token_ids) == 3
    eng.free(seq)
    eng.check_invariants()
    replayed = LLMEngine.replay(eng.config, eng.trace)
    assert replayed.snapshot().blocks == eng.snapshot().blocks
