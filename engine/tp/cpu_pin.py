"""Which CPU cores tensor-parallel workers run on, when they are pinned (PAGEDLAB_TP_PIN=1).

A synchronous step under tensor parallelism is host work in series: the engine's, then worker
0's launch, then the GPU. Every side spins while it waits (engine/tp/shm_ring.py), and a spinning
process slows whatever shares its core: two hyperthreads of one core run at about half speed
each. Where the processes land is up to the OS, which is one suspect for host times that doubled
from one two-GPU machine to the next (issue 43, run 4). Pinned, each worker has a whole core of
its own (all its hyperthreads), the last cores first, and the engine's process may be kept off
them (`engine_cpus`).

Cores are read from Linux's sysfs (`thread_siblings_list`); where that is missing, each CPU is
its own core.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path


def siblings(cpu: int) -> set[int]:
    """The CPUs sharing `cpu`'s core (itself included), as Linux reports them."""
    path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    try:
        return _parse_list(path.read_text())
    except (OSError, ValueError):
        return {cpu}


def _parse_list(text: str) -> set[int]:
    """'0-3,8' -> {0, 1, 2, 3, 8}."""
    out: set[int] = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def cores(allowed: Iterable[int], siblings_of: Callable[[int], set[int]] | None = None
          ) -> list[frozenset[int]]:
    """The allowed CPUs grouped by core, in order of each core's first CPU."""
    allowed, of = set(allowed), siblings_of or siblings
    groups = {frozenset(of(c) & allowed) | {c} for c in allowed}
    return sorted(groups, key=min)


def worker_cpus(size: int, allowed: Iterable[int],
                siblings_of: Callable[[int], set[int]] | None = None) -> list[set[int]] | None:
    """Rank r's CPUs: the (r+1)-th core from the end. None where there are not more cores than
    ranks (the engine needs one too): then nothing is pinned."""
    found = cores(allowed, siblings_of)
    if len(found) <= size:
        return None
    return [set(found[-1 - r]) for r in range(size)]


def engine_cpus(size: int, allowed: Iterable[int],
                siblings_of: Callable[[int], set[int]] | None = None) -> set[int] | None:
    """The CPUs the workers' cores leave (None: nothing pinned)."""
    allowed = set(allowed)
    workers = worker_cpus(size, allowed, siblings_of)
    return None if workers is None else allowed - set().union(*workers)


def pin_requested() -> bool:
    return os.environ.get("PAGEDLAB_TP_PIN", "0") == "1"


def pin_worker(rank: int, size: int) -> set[int] | None:
    """Pin this process, rank `rank` of `size`, to its core (None: too few cores, not pinned)."""
    workers = worker_cpus(size, os.sched_getaffinity(0))
    if workers is None:
        return None
    os.sched_setaffinity(0, workers[rank])
    return workers[rank]


def pin_engine(size: int) -> set[int] | None:
    """Keep this process (the engine's) off the cores of its `size` workers, once they run."""
    mine = engine_cpus(size, os.sched_getaffinity(0))
    if mine:
        os.sched_setaffinity(0, mine)
    return mine
