"""Serving work on a ZeroGPU Space's GPU: what goes there, for how long, and how it comes back.

A click on the CPU costs about a tenth of a second of a 135M model's time; a GPU call costs
seconds before its first step (a forked worker, CUDA, the weights moved onto the GPU, the engine
built) and comes out of the visitor's daily GPU quota. So clicks stay on the CPU (ui/gpu.py), and
only serving work that the CPU would take more than GPU_AFTER_S seconds for goes to the GPU: a
"Run to the end", or a serving click whose session would first have to replay a long GPU run
here. Elsewhere (CPU basic, a laptop, a GPU box) everything runs where the app runs.

A GPU call (`run_job`) gets the session as plain data (engine config, op log, what to do), and
plays it as a run of its own (history/run_history.py) on the worker's GPU in float32: the log
replayed, then the new operations or steps until the work is done or its time is nearly up. It
returns the new operations and the frame recorded after each; the session's run here adopts them
(RunHistory.adopt), so Back, Next and the timeline draw them at once. Its duration is sized to
the work from what this app's earlier calls measured (`GpuClock`), and a refusal inside it
reaches the visitor as its own sentence (a gr.Error: ZeroGPU would name any other exception by
its class only).
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from engine import EngineConfig, OutOfBlocks, ops
from history import Frame, RunHistory
from ui import limits
from ui.gpu import GPU_DTYPE, ON_ZEROGPU, gpu_function, spaces_error
from ui.refusal import refused
from ui.session import Session, UserError

GPU_AFTER_S, GPU_MAX_S = limits.GPU_AFTER_SECONDS, limits.GPU_MAX_SECONDS


def model_steps(records: list[dict[str, Any]]) -> int:
    """Forward passes an op log costs to replay (what the estimates count)."""
    steps = 0
    for rec in records:
        kind = rec.get("op") if isinstance(rec, dict) else None
        if kind == "append":
            steps += len(rec["token_ids"]) if "token_ids" in rec else int(rec.get("n", 1))
        elif kind in ("add_sequence", "step"):
            steps += 1
    return steps


def run_steps(session: Session) -> int:
    """Scheduler steps a Run to the end may take from the cursor: the longest request's tokens
    and a step per live request, at most MAX_RUN_STEPS (a run stops there anyway)."""
    live = len(session.frame().requests)
    if not live:
        return 0
    asked = [rec["params"].get("max_tokens", 16) for rec in session.ops[: session.pos]
             if rec.get("op") == "add_request"]
    return min(limits.MAX_RUN_STEPS, max(asked, default=16) + live)


@dataclass
class GpuClock:
    """What this app has measured of its devices: seconds per model step on the CPU and on the
    GPU, and a GPU call's seconds around its steps (fork, CUDA, weights, engine, transport). It
    starts from guesses a CPU would meet (a simulated Space's GPU is the CPU) and learns."""

    cpu_step_s: float = 0.15
    gpu_step_s: float = 0.1
    gpu_start_s: float = 10.0
    gpu_calls: int = 0  # measured so far: the first measurement replaces the guesses
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def cpu_seconds(self, steps: int) -> float:
        return steps * self.cpu_step_s

    def duration(self, steps: int) -> int:
        """Seconds a GPU call of `steps` model steps asks for: the estimate with half again for
        safety, whole seconds, at most GPU_MAX_S."""
        return min(GPU_MAX_S, math.ceil(1.5 * (self.gpu_start_s + steps * self.gpu_step_s)) + 1)

    def learn_cpu(self, steps: int, seconds: float) -> None:
        if steps:
            with self.lock:
                self.cpu_step_s = 0.5 * self.cpu_step_s + 0.5 * seconds / steps

    def learn_gpu(self, steps: int, step_seconds: float, wall: float) -> None:
        with self.lock:
            keep = 0.5 if self.gpu_calls else 0.0  # then a running mean of the last few
            if steps:
                self.gpu_step_s = keep * self.gpu_step_s + (1 - keep) * step_seconds / steps
            self.gpu_start_s = keep * self.gpu_start_s + (1 - keep) * max(0.0, wall - step_seconds)
            self.gpu_calls += 1

    def learn_abort(self) -> None:
        """A call ZeroGPU cut off at its duration: ask for twice the start-up from now on (the
        first call on a fresh Space compiles its kernels)."""
        with self.lock:
            self.gpu_start_s *= 2


@dataclass(frozen=True)
class GpuJob:
    """A GPU call's arguments, all plain data: the session's engine config and log up to the
    cursor, then either new operations or a run of at most `max_steps` steps."""

    config: EngineConfig
    log: list[dict[str, Any]]
    new_ops: list[dict[str, Any]]
    max_steps: int
    seconds: int  # the duration asked for
    stop_after: float  # seconds after the call starts to stop stepping


class GpuResult:
    """What a GPU call did: its operations, the frame after each (keyed by log position), its
    model steps and their seconds (the engine's build not counted), and why it stopped ("done",
    "time", "steps"). Pickled as it is: snapshots and finished outputs pickle (an output with its
    text, decoded on the GPU's side)."""

    def __init__(self, records: list, frames: dict[int, Frame], steps: int, step_seconds: float,
                 stopped: str) -> None:
        self.records, self.frames, self.steps = records, frames, steps
        self.step_seconds, self.stopped = step_seconds, stopped


def _job(job: GpuJob) -> GpuResult:
    """Inside the GPU call: replay, act, record. Refusals and failures become gr.Errors that
    keep their sentence."""
    start = time.monotonic()
    run = RunHistory(dataclasses.replace(job.config, device="auto", dtype=GPU_DTYPE))
    try:
        run.any_engine()  # built first: what comes after is model steps (the clock counts them apart)
        built = time.monotonic()
        run.replay(job.log)
        base = len(run)
        for rec in job.new_ops:
            op = ops.parse(rec)
            Session.check_op(op, run.engine, run.log)
            if isinstance(op, ops.Step) and not run.engine.has_pending_work():
                raise UserError("no request is waiting or running: add a request first")
            run.act(op)
        stopped = "done"
        while job.max_steps and run.engine.has_pending_work():
            if len(run) - base >= job.max_steps or time.monotonic() - start > job.stop_after:
                stopped = "steps" if len(run) - base >= job.max_steps else "time"
                break
            run.act(ops.Step())
        records = run.log[base:]
        frames = {p: run.recorded(p) for p in range(base + 1, len(run) + 1)}
        steps = model_steps(job.log) + model_steps(records)
        return GpuResult(records, frames, steps, time.monotonic() - built, stopped)
    except (UserError, ValueError, OutOfBlocks) as err:
        raise refused("the GPU run", str(err)) from None
    except Exception as err:  # a bug: its traceback to the log, a sentence to the visitor
        traceback.print_exc(file=sys.stderr)
        raise refused("the GPU run", f"something went wrong on the GPU ({type(err).__name__}); "
                      "this session's operation log is intact") from None
    finally:
        run.let_go()


#: the one GPU function (ZeroGPU registers it at launch), asking for the job's own estimate
run_job = gpu_function(_job, duration=lambda job: job.seconds)


def serve(clock: GpuClock, session: Session, op: ops.Op) -> None:
    """One serving operation (Add request, Step) where it is cheap: here, unless the session
    would first replay more than GPU_AFTER_S of a GPU run on the CPU."""
    record = op.to_record()
    if _to_gpu(clock, session, model_steps([record])) and _on_gpu(clock, session, [record], 0):
        return
    _here(clock, session)
    if isinstance(op, ops.Step) and not session.engine.has_pending_work():
        raise UserError("no request is waiting or running: add a request first")
    started = time.monotonic()
    session.run(op)
    clock.learn_cpu(model_steps([record]), time.monotonic() - started)


def run_to_end(clock: GpuClock, session: Session) -> None:
    """Step until no request waits or runs (at most MAX_RUN_STEPS): on the GPU when the CPU
    would take longer than GPU_AFTER_S, else here."""
    steps = run_steps(session)
    if steps and _to_gpu(clock, session, steps) and _on_gpu(clock, session, [], steps):
        return
    _here(clock, session)
    started, done = time.monotonic(), 0
    for _ in range(limits.MAX_RUN_STEPS):
        if not session.engine.has_pending_work():
            break
        session.run(ops.Step())
        done += 1
    clock.learn_cpu(done, time.monotonic() - started)


def _here(clock: GpuClock, session: Session) -> None:
    """The engine here brought to the cursor (a replay after a GPU run: measured as CPU steps)."""
    behind = model_steps(session.behind())
    started = time.monotonic()
    session.engine  # noqa: B018 (the property moves the engine)
    clock.learn_cpu(behind, time.monotonic() - started)


def _to_gpu(clock: GpuClock, session: Session, steps: int) -> bool:
    if not ON_ZEROGPU:
        return False
    return clock.cpu_seconds(model_steps(session.behind()) + steps) > GPU_AFTER_S


def _on_gpu(clock: GpuClock, session: Session, new_ops: list[dict], run: int) -> bool:
    """Run the job on the GPU (the new ops, or a run estimated at `run` steps: the duration is
    sized to the estimate, the run stops at MAX_RUN_STEPS or its time) and adopt what it did;
    False (and a warning) when ZeroGPU gives no GPU this time (quota spent, queue full, task
    aborted): the caller runs it here."""
    log = session.ops[: session.pos]
    seconds = clock.duration(model_steps(log) + model_steps(new_ops) + run)
    cap = limits.MAX_RUN_STEPS if run else 0
    job = GpuJob(session.config, log, new_ops, cap, seconds, 0.8 * seconds - 1)
    started = time.monotonic()
    try:
        result = _in_fresh_thread(run_job, job)
    except gr.Error as err:
        if not spaces_error(err):
            raise  # the job's own refusal, its sentence intact
        if err.message == "GPU task aborted":
            clock.learn_abort()
        gr.Warning(f"No GPU this time ({err.title}). {err.message} This runs on the CPU instead.")
        return False
    clock.learn_gpu(result.steps, result.step_seconds, time.monotonic() - started)
    session.adopt(len(log), result.records, result.frames)
    if result.stopped == "time":
        session.notice = (f"The GPU call's {seconds} s ran out after {len(result.records)} "
                          "steps; press Run to the end again to go on")
    return True


def _in_fresh_thread(fn: Any, *args: Any) -> Any:
    """fn(*args) in a new thread that carries this one's context (the Gradio request, which
    ZeroGPU reads the visitor from). ZeroGPU forks its worker from the calling thread, and a
    thread that has run torch's OpenMP loops leaves the child a pool of threads that do not
    exist there: its first parallel loop waits forever (the simulated Space showed it, in the
    worker's first torch.zeros). A new thread has no such pool."""
    context, out = contextvars.copy_context(), {}

    def target() -> None:
        try:
            out["value"] = context.run(fn, *args)
        except BaseException as err:  # noqa: BLE001 (re-raised in the calling thread)
            out["error"] = err

    thread = threading.Thread(target=target, name="pagedlab-gpu-call")
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]
