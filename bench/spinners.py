"""Busy CPUs beside a benchmark. Run 20 found the lent GPU machine's cores at two speeds, all
at once: fast while the machine is busy, about half speed while its threads only wake for a
few ms at a time (the host's power management, outside the guest). `spinning(n)` keeps n CPUs
busy with a pure-Python loop in processes of their own, pinned away from the benchmark, whose
threads keep the other CPUs. Whether that holds the fast speed is measured (NOTES, run 28), not
assumed."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def spinning(n: int) -> Iterator[list[int]]:
    """Within the block, n CPUs (the last ones this process may use) run busy loops and this
    thread runs on the rest; yields the busy CPUs ([] when n is 0 or too many)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_setaffinity") else []
    if n <= 0 or len(cpus) <= n:
        yield []
        return
    busy = cpus[-n:]
    loop = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", loop, str(c)]) for c in busy]
    os.sched_setaffinity(0, set(cpus) - set(busy))
    try:
        yield busy
    finally:
        for p in procs:
            p.kill()
            p.wait()
        os.sched_setaffinity(0, set(cpus))
