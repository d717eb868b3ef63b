"""The host's CPUs as a benchmark run had them: two-GPU runs' host times moved twofold from one
machine to the next (issue 43, run 4), so each run says what it ran on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from engine.tp.cpu_pin import siblings


def host_cpus(worker0: list[int] | None = None) -> dict[str, Any]:
    """The CPU model, how many, this process's CPUs, the CPUs sharing a core with its first (two:
    hyperthreads) and worker 0's CPUs where given (its hello's)."""
    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    model = next((line.split(":", 1)[1].strip() for line in _cpuinfo().splitlines()
                  if line.startswith("model name")), None)
    out = {"model": model, "count": os.cpu_count(), "engine": span(mine),
           "siblings_of_first": span(sorted(siblings(mine[0]))) if mine else None}
    if worker0 is not None:
        out["worker0"] = span(worker0)
    return out


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def span(cpus: list[int] | None) -> str | None:
    """[0, 1, 2, 5] -> '0-2,5'."""
    if not cpus:
        return None
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)
