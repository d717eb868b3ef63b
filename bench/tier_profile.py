"""Where a step that issues a tier load spends its time (issue 44: others' tokens/s fell to 0.59x
in those steps): `tier.overlap` run again with each step's host functions profiled apart (steps
with a load against quiet ones), and one window of steps under torch.profiler, host operations
and GPU kernels and copies, with its timeline.

    python bench/tier.py --only overlap_profile --out "$OUT/tier_profile.json"
"""

from __future__ import annotations

import contextlib
import cProfile
import json
import pstats
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from bench import tier
from bench.measure import top_functions

WINDOW = (24, 48)  # steps under torch.profiler: loads begin after step 16, every 8 steps


class StepProbe:
    """cProfile each step outside the window (kept for decode steps, by whether a load was
    issued), torch.profiler over the window's steps."""

    def __init__(self, device: str, trace: Path | None) -> None:
        self.device, self.trace = device, trace
        self.host: dict[bool, pstats.Stats | None] = {True: None, False: None}
        self.walls: list[tuple[int, float, bool]] = []  # the window's steps: (step, ms, load)
        self._prof: cProfile.Profile | None = None
        self._torch: Any = None
        self.tables: dict[str, list[str]] = {}

    @contextlib.contextmanager
    def step(self, i: int) -> Iterator[None]:
        if i == WINDOW[0]:
            acts = [torch.profiler.ProfilerActivity.CPU]
            if self.device == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            self._torch = torch.profiler.profile(activities=acts)
            self._torch.__enter__()
        inside = WINDOW[0] <= i < WINDOW[1]
        self._prof = None if inside else cProfile.Profile()
        if self._prof:
            self._prof.enable()
        try:
            yield
        finally:
            if self._prof:
                self._prof.disable()
            if i == WINDOW[1] - 1:
                self._close_window()

    def heard(self, i: int, wall: float, loads: bool, decode_only: bool) -> None:
        if WINDOW[0] <= i < WINDOW[1]:
            self.walls.append((i, round(1e3 * wall, 3), loads))
        elif decode_only and self._prof is not None:
            kept = self.host[loads]
            self.host[loads] = pstats.Stats(self._prof) if kept is None else kept.add(self._prof)

    def _close_window(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
        self._torch.__exit__(None, None, None)
        avg = self._torch.key_averages()
        self.tables["host_ops"] = avg.table(sort_by="self_cpu_time_total", row_limit=30).splitlines()
        if self.device == "cuda":
            self.tables["gpu"] = avg.table(sort_by="self_cuda_time_total",
                                           row_limit=25).splitlines()
        if self.trace is not None:
            self._torch.export_chrome_trace(str(self.trace))

    def host_tables(self) -> dict[str, list[str]]:
        """Each kind of step's top functions by own time (summed over its steps)."""
        return {"load" if loads else "quiet": top_functions(st)
                for loads, st in self.host.items() if st is not None}


def profiled_overlap(path: str, device: str, sizes: dict, out: Path) -> dict:
    """`tier.overlap` with a StepProbe: its figures (slowed by the profilers), the host tables,
    the window's step walls and torch.profiler's tables; the timeline goes to
    tier_overlap_trace.json beside the results."""
    probe = StepProbe(device, out / "tier_overlap_trace.json" if device == "cuda" else None)
    figures = tier.overlap(path, device, sizes, probe)
    return {"figures_profiled": figures, "host": probe.host_tables(), "window": probe.walls,
            **probe.tables}


def repeat_timeline(path: str, device: str, sizes: dict, out: Path) -> dict:
    """One repeat of the evicted document (`tier.repeat_cycle`'s), with the tier and without,
    under torch.profiler with each engine step marked: when each step's host work began and
    ended, and what each GPU stream ran when (ms from the request's arrival). The timeline goes
    to tier_repeat_trace_<name>.json beside the results."""
    got = {}
    for name, slots in (("tier", tier.REPEAT_TIER), ("recompute", 0)):
        eng = tier.engine(path, device, sizes["pool"], slots)
        prefix = tier.hybrid._prompts(1, sizes["doc"], sizes["doc"], 4)[0]
        evictor = tier.hybrid._prompts(1, sizes["evictor"], sizes["evictor"], 5)[0]
        for r in range(3):
            eng.generate([prefix + [7, 8, 9, 10 + r]], tier.ONE)
            eng.generate([evictor[r:] + evictor[:r]], tier.ONE)
            if r < 2:
                eng.generate([prefix + [11, 12, 13, 14 + r]], tier.ONE)
        tier.sync(device)
        acts = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=acts) as prof, _host_phases(eng):
            with torch.profiler.record_function("request"):
                eng.add_request(prefix + [11, 12, 13, 20], tier.ONE)
                step = 0
                while eng.has_pending_work():
                    with torch.profiler.record_function(f"step {step}"):
                        eng.step()
                    step += 1
                tier.sync(device)
        eng.close()
        trace = out / f"tier_repeat_trace_{name}.json"
        prof.export_chrome_trace(str(trace))
        got[name] = timeline(trace)
    return got


@contextlib.contextmanager
def _host_phases(eng: Any) -> Iterator[None]:
    """Each host phase of a step marked on the timeline (schedule; the runtime's copies and
    forward pass; the picks; landing the tokens), by wrapping the engine's parts in this run
    only: the product carries no profiler marks."""
    from engine import step_run
    parts = [(eng.scheduler, "schedule", "schedule"), (step_run, "execute", "run"),
             (step_run, "pick", "pick"), (eng._flight, "after_launch", "land"),
             (eng.runtime, "offload", "offload"), (eng.runtime, "load", "load"),
             (eng.runtime, "execute", "forward")]
    saved = [(obj, name, obj.__dict__.get(name) if not isinstance(obj, type(step_run)) else
              getattr(obj, name)) for obj, name, _ in parts]
    for obj, name, label in parts:
        setattr(obj, name, _marked(getattr(obj, name), label))
    try:
        yield
    finally:
        for obj, name, before in saved:
            if before is None:
                delattr(obj, name)  # an instance's bound method: its class's comes back
            else:
                setattr(obj, name, before)


def _marked(fn: Any, label: str) -> Any:
    def marked(*a: Any, **kw: Any) -> Any:
        with torch.profiler.record_function(label):
            return fn(*a, **kw)
    return marked


def timeline(trace: Path) -> dict:
    """The marked spans (request, steps) and every GPU kernel and copy, by stream, in ms from
    the request's start; with each stream's busy time."""
    events = json.loads(trace.read_text())["traceEvents"]
    marks = [e for e in events if e.get("cat") == "user_annotation"]
    start = min(e["ts"] for e in marks if e["name"] == "request")
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                 key=lambda e: e["ts"])

    def ms(t: float) -> float:
        return round((t - start) / 1e3, 3)

    streams: dict[str, list] = {}
    for e in gpu:
        streams.setdefault(str(e.get("tid")), []).append(
            (ms(e["ts"]), round(e["dur"] / 1e3, 3), e["name"][:48]))
    return {"marks": [(m["name"], ms(m["ts"]), round(m["dur"] / 1e3, 3)) for m in marks],
            "busy_ms": {s: round(sum(d for _, d, _ in v), 3) for s, v in streams.items()},
            "streams": {s: _merge_runs(v) for s, v in streams.items()}}


def _merge_runs(ops: list[tuple[float, float, str]]) -> list[tuple[float, float, str, int]]:
    """Consecutive ops of one name as one row (start, total ms, name, count): a layer's
    kernels repeat 16 times in a row, and a timeline of thousands of rows is unread."""
    rows: list[list] = []
    for start, dur, name in ops:
        if rows and rows[-1][2] == name:
            rows[-1][1] += dur
            rows[-1][3] += 1
        else:
            rows.append([start, dur, name, 1])
    return [(s, round(d, 3), n, c) for s, d, n, c in rows]
