"""Where a step that issues a tier load spends its time (issue 44: others' tokens/s fell to 0.59x
in those steps): `tier.overlap` run again with each step's host functions profiled apart (steps
with a load against quiet ones), and one window of steps under torch.profiler, host operations
and GPU kernels and copies, with its timeline.

    python bench/tier.py --only overlap_profile --out "$OUT/tier_profile.json"
"""

from __future__ import annotations

import contextlib
import cProfile
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
