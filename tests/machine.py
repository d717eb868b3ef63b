"""What the machine running the tests gives them: the CPUs this process may use (its affinity,
capped by a cgroup CPU quota where one is set) and a one-line account of the machine (for the
run's first and last lines, so that a slow run on another machine says what that machine was)."""

from __future__ import annotations

import math
import os
from pathlib import Path

QUOTA_FILES = (("/sys/fs/cgroup/cpu.max", None),  # cgroup v2: "<quota> <period>" or "max ..."
               ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"))


def cpu_quota() -> float | None:
    """CPUs' worth of time the cgroup allows (None: no quota)."""
    for quota_file, period_file in QUOTA_FILES:
        try:
            words = Path(quota_file).read_text().split()
            quota, period = words[0], words[1] if period_file is None else Path(period_file).read_text()
        except (OSError, IndexError):
            continue
        if quota in ("max", "-1"):
            return None
        return int(quota) / int(period)
    return None


def usable_cpus() -> int:
    mine = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cpu_quota()
    return max(1, min(mine, math.ceil(quota))) if quota else mine


def describe() -> str:
    quota = cpu_quota()
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"machine: {os.cpu_count()} CPUs, {usable_cpus()} usable"
            f"{f' (cgroup quota {quota:.2f})' if quota else ''}, OMP_NUM_THREADS="
            f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, load average {load}")
