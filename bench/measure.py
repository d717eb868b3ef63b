"""What both load benches measure the same way: the served app's resident memory (now, and its
peak while a load runs) and percentiles of latencies. bench/load.py and bench/room_load.py both
import it, so neither needs the other for it (they used to import each other)."""

from __future__ import annotations

import threading
import time

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
