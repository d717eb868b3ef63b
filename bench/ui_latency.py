"""Server-side time from a click to updated figures, and the figures' JSON size.

What one Playground click costs on the server: the engine operation on the session plus the
redraw (ui.render: pool figure, event log, sequences, metrics), serialized as Gradio sends it.
Targets (2-core CPU): median <= 100 ms for an operation on a 256-block dry pool, <= 300 ms for a
real-model append on a 64-block pool; figures of a 1024-block pool <= 300 KB of JSON.

    python bench/ui_latency.py [--out bench/results/ui_latency.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import EngineConfig  # noqa: E402
from ui.render import render  # noqa: E402
from ui.session import Session  # noqa: E402


def click(session: Session, name: str, *args, **kw) -> float:
    t = time.perf_counter()
    session.run(name, *args, **kw)
    fig = render(session)[0]
    fig.to_json()  # what Gradio serializes and sends
    return time.perf_counter() - t


def dry_clicks(n: int = 60) -> list[float]:
    s = Session(EngineConfig(model=None, block_size=16, num_gpu_blocks=256))
    times = []
    seqs = [s.run("add_sequence", "a" * 100) for _ in range(8)]
    for i in range(n):
        seq = seqs[i % len(seqs)]
        times.append(click(s, "append", seq, n=4))
        if i % 10 == 9:
            times.append(click(s, "free", s.run("fork", seq)))
    return times


def real_clicks(n: int = 20) -> list[float]:
    s = Session(EngineConfig(model="default", block_size=16, num_gpu_blocks=64))
    seq = s.run("add_sequence", "The history of paged memory begins with")
    s.run("fork", seq)
    return [click(s, "append", seq, n=1) for _ in range(n)]


def figure_kb(num_blocks: int) -> float:
    s = Session(EngineConfig(model=None, block_size=16, num_gpu_blocks=num_blocks))
    i = 0
    while s.engine.snapshot().num_free_blocks > 40:  # distinct prompts: no prefix hits
        s.run("add_sequence", f"{i:06d}" + "x" * (16 * 30 - 6))
        i += 1
    return len(render(s)[0].to_json()) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/ui_latency.json")
    args = ap.parse_args()
    dry = dry_clicks()
    real = real_clicks()
    res = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "dry_256_blocks_click_ms": {"median": 1e3 * statistics.median(dry), "max": 1e3 * max(dry),
                                    "clicks": len(dry), "target_median": 100},
        "real_64_blocks_append_ms": {"median": 1e3 * statistics.median(real), "max": 1e3 * max(real),
                                     "clicks": len(real), "target_median": 300},
        "figure_json_kb": {"256_blocks": figure_kb(256), "1024_blocks": figure_kb(1024),
                           "4096_blocks": figure_kb(4096), "target_1024": 300},
    }
    print(json.dumps(res, indent=1))
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
