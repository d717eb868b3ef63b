"""Which of the machine's CPUs run at half speed, and when: the host's two speeds (runs 18-19),
CPU by CPU.

    python bench/host_cpus.py --seconds 90 --out "$OUT/host_cpus.json"     # no GPU needed
    python bench/host_cpus.py --seconds 3 --out /tmp/host_cpus.json         # a smoke run

Runs 18-19 found an engine's thread at one of two speeds (a fixed Python loop in 1.6-2.0 ms or
in 3.2-4.5), switching within a process, pinned or not, with no interrupt and no stolen time the
guest can see. This samples every CPU at once: one process pinned to each, timing the same loop
(`host_speed.python_ms`'s, one pass) every `--every` ms, mostly asleep so as not to load the
machine. Which CPUs are slow together, and for how long, says where the time goes: all at once
(the host's clock or power), in pairs (two vCPUs on the two threads of one core), or one CPU at
a time (a core shared with another tenant's work). If a slow CPU stays slow for seconds while
others are fast, an engine could pin itself to a fast one.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path


def loop_ms() -> float:
    """One pass of host_speed's fixed loop (dict, list and int work, as the scheduler's)."""
    t0 = time.perf_counter()
    d: dict[int, list[int]] = {}
    for i in range(20000):
        d.setdefault(i & 255, []).append(len(d) + i)
    return 1e3 * (time.perf_counter() - t0)


def sample(cpu: int, start: float, seconds: float, every_s: float, out: mp.Queue) -> None:
    """On `cpu` only: the loop's time every `every_s` from `start` (a shared wall clock) for
    `seconds`; the samples go back as (time since start, ms)."""
    os.sched_setaffinity(0, {cpu})
    rows = []
    while time.time() < start:
        time.sleep(0.001)
    tick = 0
    while (now := time.time() - start) < seconds:
        rows.append((round(now, 3), round(loop_ms(), 3)))
        tick += 1
        time.sleep(max(0.0, start + tick * every_s - time.time()))
    out.put((cpu, rows))


def summary(per_cpu: dict[int, list[tuple[float, float]]], slow_ms: float, bin_s: float) -> dict:
    """Per CPU: its median, the share of samples over `slow_ms`, and its slow stretches (s);
    per time bin of `bin_s`: which CPUs were slow in it (their median over `slow_ms`)."""
    cpus: dict = {}
    bins: dict[int, list[int]] = {}
    for cpu, rows in sorted(per_cpu.items()):
        ms = [m for _, m in rows]
        stretches, run_start, last_t = [], None, 0.0
        for t, m in rows:
            if m > slow_ms and run_start is None:
                run_start = t
            elif m <= slow_ms and run_start is not None:
                stretches.append(round(t - run_start, 2))
                run_start = None
            last_t = t
        if run_start is not None:
            stretches.append(round(last_t - run_start, 2))
        by_bin: dict[int, list[float]] = {}
        for t, m in rows:
            by_bin.setdefault(int(t // bin_s), []).append(m)
        for b, vals in by_bin.items():
            if statistics.median(vals) > slow_ms:
                bins.setdefault(b, []).append(cpu)
        slow_share = sum(m > slow_ms for m in ms) / len(ms)
        cpus[cpu] = {"samples": len(ms), "median_ms": round(statistics.median(ms), 3),
                     "fast_ms": round(min(ms), 3), "slow_share": round(slow_share, 3),
                     "slow_stretches_s": stretches[:40], "longest_slow_s": max(stretches, default=0.0)}
    n_bins = 1 + max((int(t // bin_s) for rows in per_cpu.values() for t, _ in rows), default=0)
    slow_sets = [sorted(bins.get(b, [])) for b in range(n_bins)]
    together: dict[str, int] = {}
    for cpus_slow in slow_sets:
        key = ",".join(map(str, cpus_slow)) or "none"
        together[key] = together.get(key, 0) + 1
    return {"cpus": cpus, "bin_s": bin_s, "slow_cpus_per_bin": slow_sets,
            "slow_sets_count": dict(sorted(together.items(), key=lambda kv: -kv[1])[:30])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--every", type=float, default=25.0, help="ms between one CPU's samples")
    ap.add_argument("--bin", type=float, default=1.0, help="seconds a time bin of the summary")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    ctx = mp.get_context("fork")
    queue: mp.Queue = ctx.Queue()
    start = time.time() + 1.0
    procs = [ctx.Process(target=sample, args=(c, start, args.seconds, args.every / 1e3, queue))
             for c in cpus]
    for p in procs:
        p.start()
    per_cpu = dict(queue.get() for _ in procs)
    for p in procs:
        p.join()
    fast = min(min(m for _, m in rows) for rows in per_cpu.values())
    slow_ms = 1.5 * fast  # the two speeds are ~2x apart: anything over 1.5x the fastest is slow
    out = {"num_cpus": len(cpus), "started_at": start, "seconds": args.seconds, "every_ms": args.every,
           "fastest_ms": fast,
           "slow_over_ms": round(slow_ms, 3), **summary(per_cpu, slow_ms, args.bin),
           "samples": {c: rows for c, rows in sorted(per_cpu.items())}}
    Path(args.out).write_text(json.dumps(out))
    print(json.dumps({"fastest_ms": fast, "slow_over_ms": out["slow_over_ms"],
                      "per_cpu": {c: (v["median_ms"], v["slow_share"], v["longest_slow_s"])
                                  for c, v in out["cpus"].items()},
                      "slow_sets_count": out["slow_sets_count"]}))


if __name__ == "__main__":
    main()
