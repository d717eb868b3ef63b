"""How fast the views of the run redraw (issue 34): a step's redraw of the request timeline,
memory over time and the prefix tree, with 64 requests over about 500 engine steps.

A dry session (block size 16, 64 blocks, the CPU tier of 16 slots) serves 64 requests that
arrive one every 7 steps, each with its own prompt after a shared system prompt (prefix hits),
some with samples or beams, in a pool small enough to preempt; every step through the session,
so each view is recorded as the page records it. Then, per view, the server side of one redraw
as the page does it: the figure from the recorded views (ui/run_views.session_view) and its
JSON, as Gradio serializes and sends it, for Back / Next moves over the whole log and for the
redraw after a new step. Target: under 300 ms per redraw on the 2-core CPU, in presenter mode
(1280 x 720: a box of 790 x 650) and on a laptop's column.

    python bench/run_views.py [--out bench/results/run_views.json] [--smoke]
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

from engine import EngineConfig, SamplingParams, ops  # noqa: E402
from ui.run_views import session_view  # noqa: E402
from ui.session import Session  # noqa: E402

SYSTEM = "You are a patient tutor for a class on operating systems. "
TARGET_MS = 300


def workload(requests: int, every: int, max_tokens: int) -> Session:
    """The run: `requests` requests, one every `every` steps, then steps until all finish."""
    s = Session(EngineConfig(model=None, block_size=16, num_gpu_blocks=64, num_cpu_blocks=32,
                             preemption_mode="swap", num_offload_blocks=16))
    added = 0
    while added < requests or s.engine.has_pending_work():
        if added < requests and s.engine.current_step() >= added * (every + 1):
            kind = added % 8
            params = SamplingParams(max_tokens=max_tokens + 9 * (added % 5), ignore_eos=True,
                                    n=3 if kind == 3 else 1, temperature=0.8 if kind == 3 else 0,
                                    beam_width=2 if kind == 5 else 1, seed=added)
            s.run(ops.AddRequest(SYSTEM + f"Student {added} asks about pages. " * (1 + kind % 3),
                                 params))
            added += 1
        s.run(ops.Step())
    return s


def redraw_ms(s: Session, choice: str, box: tuple[int, int], large: bool,
              positions: list[int]) -> dict:
    """The server side of a redraw of view `choice` at each of `positions` (wall and CPU ms)."""
    s.view_choice, s.box, s.presenter = choice, box, large
    wall, cpu, size = [], [], 0
    for pos in positions:
        s.goto(pos)
        t, c = time.perf_counter(), time.process_time()
        payload = session_view(s, box).to_json()
        wall.append(1e3 * (time.perf_counter() - t))
        cpu.append(1e3 * (time.process_time() - c))
        size = max(size, len(payload))
    return {"median_ms": statistics.median(wall), "max_ms": max(wall),
            "cpu_median_ms": statistics.median(cpu), "cpu_max_ms": max(cpu), "redraws": len(wall),
            "json_kb_max": round(size / 1024, 1), "target_ms": TARGET_MS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/run_views.json")
    ap.add_argument("--smoke", action="store_true", help="8 requests, a few redraws")
    args = ap.parse_args()
    requests, every, tokens = (8, 3, 12) if args.smoke else (64, 6, 40)
    t = time.perf_counter()
    s = workload(requests, every, tokens)
    built = time.perf_counter() - t
    timeline = s.recorded(len(s.ops)).timeline
    n = len(s.ops)
    # each view redrawn at `moves` places over the log (Back / Next), then `again` times at its end
    moves, again = (2, 1) if args.smoke else (25, 5)
    positions = sorted({max(1, n - 1 - i * (n // moves)) for i in range(moves)})  # Back / Next
    res: dict = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                             "load_average_at_start": os.getloadavg()},
                 "smoke": args.smoke,
                 "run": {"requests": len(timeline.lanes), "engine_steps": len(timeline.steps),
                         "operations": n, "build_s": round(built, 1),
                         "preemptions": s.frame().snapshot.metrics.extra["preemptions"],
                         "prefix_hit_blocks": s.frame().snapshot.metrics.prefix_hit_blocks}}
    for where, box, large in (("presenter_1280x720", (790, 650), True),
                              ("laptop_1440x900", (860, 0), False),
                              ("phone_390", (370, 0), False)):
        for choice in ("timeline", "memory", "prefix tree"):
            key = f"{choice.replace(' ', '_')}_{where}"
            res[key] = {"back_next": redraw_ms(s, choice, box, large, positions),
                        "after_the_last_step": redraw_ms(s, choice, box, large, [n] * again)}
            print(key, json.dumps(res[key]), flush=True)
    res["machine"]["load_average_at_end"] = os.getloadavg()
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
