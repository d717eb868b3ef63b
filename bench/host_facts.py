"""The host's CPUs as a benchmark run had them: two-GPU runs' host times moved twofold from one
machine to the next (issue 43, run 4), so each run says what it ran on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def host_cpus() -> dict[str, Any]:
    """The CPU model, how many, this process's CPUs and the CPUs sharing a core with its first
    (two: hyperthreads)."""
    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    model = next((line.split(":", 1)[1].strip() for line in _cpuinfo().splitlines()
                  if line.startswith("model name")), None)
    out = {"model": model, "count": os.cpu_count(), "engine": span(mine),
           "siblings_of_first": span(sorted(siblings(mine[0]))) if mine else None}
    return out


def siblings(cpu: int) -> set[int]:
    """The CPUs sharing `cpu`'s core (itself included), as Linux reports them."""
    try:
        text = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text()
    except OSError:
        return {cpu}
    out: set[int] = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
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
