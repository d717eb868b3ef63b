"""Serving work as a ZeroGPU GPU call (ui/gpu_jobs.py), run in this process (the forked, pickled
call itself is tests/space/'s): the call replays the session's log, runs, and returns records
and views that pickle; the session adopts them, Back and Next draw them without the engine, and
the engine here replays them when the visitor acts, saying so if it parts from the GPU's tokens;
a refusal inside the call keeps its sentence; the call's duration follows what was measured."""

from __future__ import annotations

import pickle

import gradio as gr
import pytest

from engine import EngineConfig, SamplingParams, ops
from ui import gpu_jobs
from ui.gpu_jobs import GpuClock, GpuJob, run_job
from ui.session import Session

TINY = EngineConfig(model="tiny-random", block_size=4, num_gpu_blocks=32, num_cpu_blocks=32,
                    preemption_mode="swap", device="cpu")


def serving(prompt: str = "Paged memory is") -> Session:
    s = Session(TINY)
    s.run(ops.AddRequest(prompt, SamplingParams(max_tokens=6, n=2, temperature=1.0, seed=3)))
    s.run(ops.AddRequest("Beams", SamplingParams(max_tokens=5, beam_width=2)))
    return s


def job(s: Session, new_ops=(), steps=100, seconds=60, stop_after=50.0) -> GpuJob:
    return GpuJob(s.config, s.ops[: s.pos], list(new_ops), steps, seconds, stop_after)


def run_here(s: Session) -> None:
    while s.engine.has_pending_work():
        s.run(ops.Step())


def test_a_gpu_job_replays_runs_to_the_end_and_comes_back_pickled(tiny_model):
    on_gpu, here = serving(), serving()
    result = pickle.loads(pickle.dumps(run_job(job(on_gpu))))  # as ZeroGPU's queue carries it
    run_here(here)
    assert result.stopped == "done" and result.records == here.ops[2:]
    assert set(result.frames) == set(range(3, len(here.ops) + 1))
    for pos, view in result.frames.items():
        here.goto(pos)
        assert view.snapshot == here.frame().snapshot and view.events == here.frame().events
    texts = {o.request_id: [c.text for c in o.outputs] for o in here.frame().finished}
    assert {o.request_id: [c.text for c in o.outputs] for o in view.finished} == texts
    assert all(t for outs in texts.values() for t in outs)


def test_adopted_views_draw_without_the_engine_until_the_visitor_acts(tiny_model):
    s, here = serving(), serving()
    s.frame()  # the engine here stands at operation 2
    result = run_job(job(s))
    s.adopt(2, result.records, result.frames)
    end = s.pos
    s.goto(end - 3)
    s.goto(end)
    assert not s.engine_ready and len(s.behind()) == end - 2  # Back and Next moved no engine
    run_here(here)
    s.run(ops.AddRequest("Again", SamplingParams(max_tokens=2)))  # replays, checked, then acts
    here.run(ops.AddRequest("Again", SamplingParams(max_tokens=2)))
    assert s.take_notice() == "" and s.frame().snapshot == here.frame().snapshot


def test_a_replay_that_parts_from_the_gpus_tokens_says_so(tiny_model):
    s = serving("Another prompt entirely")
    other = serving()
    result = run_job(job(other))  # the same records, another run's views
    s.adopt(2, result.records, result.frames)
    s.run(ops.AddRequest("Again", SamplingParams(max_tokens=2)))
    assert "chose other tokens than the GPU did" in s.take_notice()
    here = serving("Another prompt entirely")
    run_here(here)
    for pos in range(3, len(result.records) + 3):  # the page now shows this engine's own run
        s.goto(pos)
        here.goto(pos)
        assert s.frame().snapshot == here.frame().snapshot


def test_refusals_inside_a_gpu_job_keep_their_sentence(tiny_model):
    empty = Session(TINY)
    with pytest.raises(gr.Error) as err:
        run_job(job(empty, [ops.Step().to_record()], steps=0))
    assert err.value.message == "no request is waiting or running: add a request first"
    long = ops.AddRequest(" 7" * 1100, SamplingParams(max_tokens=4)).to_record()
    with pytest.raises(gr.Error) as err:
        run_job(job(empty, [long], steps=0))
    assert "tokens; the most is 1,024" in err.value.message


def test_a_run_out_of_time_stops_between_steps_and_says_so(tiny_model):
    s = serving()
    s.frame()
    assert gpu_jobs._on_gpu(GpuClock(gpu_step_s=0, gpu_start_s=0), s, [], 50)
    assert len(s.ops) == 2 and s.engine.has_pending_work()  # nothing done; the run waits
    assert "ran out after" in s.take_notice()


def test_the_duration_asked_follows_what_the_calls_measured():
    clock = GpuClock()
    first = clock.duration(40)
    assert first == min(gpu_jobs.GPU_MAX_S, 22)  # 1.5 x (10 s of start + 40 x 0.1 s) + 1
    clock.learn_gpu(40, 0.2, 0.7)  # a call of 40 steps of 5 ms and 0.5 s around them
    assert clock.duration(40) == 3  # 1.5 x (0.5 + 40 x 0.005) + 1, from the first measurement on
    start = clock.gpu_start_s
    clock.learn_abort()  # one cut off: twice the start-up from now on
    assert clock.gpu_start_s == 2 * start and clock.duration(400) > 1.5 * 400 * 0.005 + 2 * start
    assert clock.duration(10**6) == gpu_jobs.GPU_MAX_S


def test_no_gpu_this_time_runs_the_work_here_and_says_so(tiny_model, monkeypatch):
    def quota_spent(job):  # what ZeroGPU raises before a call when the visitor's quota is spent
        raise gr.Error("You have exceeded your free ZeroGPU quota (9s requested vs. 2s left).",
                       title="ZeroGPU quota exceeded")

    warned: list[str] = []
    monkeypatch.setattr(gpu_jobs, "ON_ZEROGPU", True)
    monkeypatch.setattr(gpu_jobs, "GPU_AFTER_S", 0)
    monkeypatch.setattr(gpu_jobs, "run_job", quota_spent)
    monkeypatch.setattr(gr, "Warning", lambda message, **_: warned.append(message))
    s, here = serving(), serving()
    gpu_jobs.run_to_end(GpuClock(), s)
    run_here(here)
    assert warned == ["No GPU this time (ZeroGPU quota exceeded). You have exceeded your free "
                      "ZeroGPU quota (9s requested vs. 2s left). This runs on the CPU instead."]
    assert s.ops == here.ops and s.frame().snapshot == here.frame().snapshot


def test_a_run_longer_than_its_estimate_still_runs_to_the_end(tiny_model):
    s, here = serving(), serving()
    s.frame()
    assert gpu_jobs._on_gpu(GpuClock(), s, [], 1)  # sized for one step, capped at MAX_RUN_STEPS
    run_here(here)
    assert s.ops == here.ops and s.take_notice() == ""
