"""What benches measure the same way: the served app's resident memory (now, and its peak while a
load runs) and percentiles of latencies (bench/load.py and bench/room_load.py both import it, so
neither needs the other for it: they used to import each other); repeated timings as median and
minimum, and runs stored under a label beside earlier ones (bench/checkpoints.py,
bench/dry_step.py); a cProfile's functions of the most own time (bench/tensor_parallel.py,
bench/tier_profile.py); the garbage collector's pauses (bench/mem_gpu.py)."""

from __future__ import annotations

import collections
import gc
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil


class RssSampler(threading.Thread):
    """The server's resident memory every 0.2 s (its peak is the "during" figure)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.peak = 0
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.2)


def rss_mb(pid: int) -> float:
    """The process's resident memory now, in MiB."""
    return psutil.Process(pid).memory_info().rss / 2**20


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values` by nearest rank."""
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def seconds_of(fn: Callable[[], object], repeats: int) -> list[float]:
    """The wall time of each of `repeats` calls of `fn`."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def median_min_ms(seconds: list[float]) -> dict[str, float]:
    """Repeated timings on a shared machine: the median (the usual) and the minimum (the least
    disturbed), in milliseconds."""
    return {"median_ms": 1e3 * statistics.median(seconds), "min_ms": 1e3 * min(seconds)}


def save_labeled(path: str, label: str, run: dict) -> None:
    """Store one run under `label` in the JSON file at `path`, beside the runs stored there
    under other labels (a "before" and an "after" of one change)."""
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            out = json.load(f)
    out[label] = run
    print(json.dumps(run, indent=1))
    with open(path, "w") as f:
        json.dump(out, f, indent=2)


def top_functions(stats: Any, per: float = 1.0, top: int = 30) -> list[str]:
    """A `pstats.Stats`'s functions of the most own time, one line each: own and cumulative µs
    and calls, divided by `per` (a run's steps: per step)."""
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]  # (cc, nc, own, cum, _)
    return [f"{1e6 * own / per:8.1f} us own {1e6 * cum / per:8.1f} us cum {calls / per:6.1f}x "
            f"{os.path.basename(f)}:{line}({name})"
            for (f, line, name), (_, calls, own, cum, _) in rows]


class GcPauses:
    """The cyclic garbage collector's pauses while it is open (`with GcPauses() as gc_pauses:`):
    how many of each generation and their milliseconds. A full (generation 2) collection walks
    every object the process tracks but the frozen ones, and frees what it finds dead; it lands
    in whatever step allocates next. `census`: what the first few full collections walk."""

    def __init__(self, census: int = 0) -> None:
        self.count = [0, 0, 0]
        self.ms = [0.0, 0.0, 0.0]
        self._start = 0.0
        self._census_left = census
        self.census: list[dict] = []  # what the first `census` full collections walked

    def _heard(self, phase: str, info: dict) -> None:
        if phase == "start":
            if info["generation"] == 2 and self._census_left:
                self._census_left -= 1
                self.census.append(heap_census())  # before the clock starts: not a pause
            self._start = time.perf_counter()
        else:
            g = info["generation"]
            self.count[g] += 1
            self.ms[g] += 1e3 * (time.perf_counter() - self._start)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._heard)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._heard)

    def summary(self) -> dict:
        out = {"collections": list(self.count), "ms": [round(m, 1) for m in self.ms]}
        return {**out, "census": self.census} if self.census else out


def heap_census(top: int = 12) -> dict:
    """What a full collection is about to walk: the objects each generation tracks (the frozen
    ones are in none) and the most common types among them, with their count."""
    generations = [gc.get_objects(generation=g) for g in range(3)]
    kinds = collections.Counter(type(o).__qualname__ for objs in generations for o in objs)
    return {"objects_by_generation": [len(objs) for objs in generations],
            "frozen": gc.get_freeze_count(),
            "top_types": kinds.most_common(top)}

