"""Server-side time from a click to updated figures, and the figures' JSON size.

What one Playground click costs on the server: the engine operation on the session plus the
redraw (ui.render: the token-level pool figure, event log, sequences, metrics), serialized as
Gradio sends it. A picture click (select a block) is a redraw without an operation.
Targets (2-core CPU): median <= 100 ms from a click to the figure at 64 blocks (dry; for the
real model, the redraw after its append), <= 300 ms for a real-model append with its decode step
and for any click at 1024 blocks; figures of a 1024-block pool <= 300 KB of JSON.
Time travel on the real model: Back / Next (goto + redraw) <= 300 ms after 5, 20 and 100
operations, whatever the history; beside it, what acting from the middle of the history costs
(the engine restored from its nearest checkpoint) against a replay from the start.

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

from engine import EngineConfig, LLMEngine, ops  # noqa: E402
from ui.render import render  # noqa: E402
from ui.session import Session  # noqa: E402


def redraw(session: Session) -> None:
    fig = render(session)[0]
    fig.to_json()  # what Gradio serializes and sends


class Clock:
    """Wall time and this process's CPU time of one click: on a machine shared with other jobs
    the wall time waits for a core, the CPU time is what the click itself costs."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def __enter__(self) -> Clock:
        self._t, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall.append(time.perf_counter() - self._t)
        self.cpu.append(time.process_time() - self._c)


def click(clock: Clock, session: Session, op: ops.Op) -> None:
    with clock:
        session.run(op)
        redraw(session)


def summary(clock: Clock, target: float) -> dict:
    return {"median": 1e3 * statistics.median(clock.wall), "max": 1e3 * max(clock.wall),
            "cpu_median": 1e3 * statistics.median(clock.cpu), "clicks": len(clock.wall),
            "target_median": target}


def fill(session: Session, leave_free: int) -> list[int]:
    """Distinct prompts (no prefix hits) until about `leave_free` blocks are left."""
    seqs, i = [], 0
    while session.engine.snapshot().num_free_blocks > leave_free:
        seqs.append(session.run(ops.AddSequence(f"{i:06d}" + "x" * (16 * 3 - 6))))
        i += 1
    return seqs


def dry_clicks(num_blocks: int, n: int = 40) -> tuple[Clock, Clock]:
    """(operation clicks, picture clicks) on a dry pool about 3/4 full."""
    s = Session(EngineConfig(model=None, block_size=16, num_gpu_blocks=num_blocks,
                             num_cpu_blocks=num_blocks))
    seqs = fill(s, num_blocks // 4)
    clicks, picks = Clock(), Clock()
    for i in range(n):
        seq = seqs[i % len(seqs)]
        click(clicks, s, ops.Append(seq, n=4))
        if i % 10 == 9:
            click(clicks, s, ops.Free(s.run(ops.Fork(seq))))
        with picks:  # a click on a block in the picture: select it and redraw
            s.selected_block = i % num_blocks
            redraw(s)
    return clicks, picks


def real_clicks(n: int = 20) -> tuple[Clock, Clock]:
    """(append clicks, their redraw alone): the model's decode step is in the first only."""
    s = Session(EngineConfig(model="default", block_size=16, num_gpu_blocks=64, num_cpu_blocks=64))
    seq = s.run(ops.AddSequence("The history of paged memory begins with"))
    s.run(ops.Fork(seq))
    clock, draw = Clock(), Clock()
    for _ in range(n):
        click(clock, s, ops.Append(seq, n=1))
        with draw:
            redraw(s)
    return clock, draw


def history(session: Session, n: int) -> None:
    """n playground operations: a prompt, then append / fork / append to the fork / free."""
    seq = session.run(ops.AddSequence("The history of paged memory begins with"))
    child = None
    for i in range(n - 1):
        kind = i % 4
        if kind == 0:
            session.run(ops.Append(seq, n=2))
        elif kind == 1:
            child = session.run(ops.Fork(seq))
        elif kind == 2:
            session.run(ops.Append(child, n=1))
        else:
            session.run(ops.Free(child))


def travel(length: int, moves: int = 10) -> dict:
    """Back / Next after `length` operations on the real model, and acting from its middle."""
    config = EngineConfig(model="default", block_size=16, num_gpu_blocks=64, num_cpu_blocks=64)
    s = Session(config)
    history(s, length)
    back, nxt, act, replay = Clock(), Clock(), Clock(), Clock()
    for _ in range(min(moves, length)):
        with back:
            s.goto(s.pos - 1)
            redraw(s)
    for _ in range(min(moves, length)):
        with nxt:
            s.goto(s.pos + 1)
            redraw(s)
    middle = length // 2 + 1
    s.goto(middle)
    with act:  # the engine comes back to `middle` from a checkpoint, then appends
        s.run(ops.Append(0, n=1))
        redraw(s)
    with replay:  # what the same point cost before checkpoints: a replay from the start
        LLMEngine.replay(config, s.ops[:middle])
    return {"back_ms": summary(back, 300), "next_ms": summary(nxt, 300),
            "act_from_middle_ms": 1e3 * act.wall[0], "replay_to_middle_ms": 1e3 * replay.wall[0]}


def figure_kb(num_blocks: int) -> float:
    s = Session(EngineConfig(model=None, block_size=16, num_gpu_blocks=num_blocks))
    fill(s, min(40, num_blocks // 4))
    return len(render(s)[0].to_json()) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/ui_latency.json")
    ap.add_argument("--note", default="", help="how busy the machine was, e.g. shared with others")
    ap.add_argument("--only-travel", action="store_true", help="measure time travel only")
    args = ap.parse_args()
    if args.only_travel:
        res = json.load(open(args.out)) if os.path.exists(args.out) else {}
        for length in (5, 20, 100):
            res[f"real_travel_after_{length}_ops"] = travel(length)
            print(length, json.dumps(res[f"real_travel_after_{length}_ops"]), flush=True)
        res.setdefault("machine", {})["travel_load_average"] = os.getloadavg()
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
        return
    res: dict = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                             "load_average_at_start": os.getloadavg(), "note": args.note}}
    for nb, target in ((64, 100), (256, 100), (1024, 300)):
        ops, picks = dry_clicks(nb)
        res[f"dry_{nb}_blocks_click_ms"] = summary(ops, target)
        res[f"dry_{nb}_blocks_picture_click_ms"] = summary(picks, target)
    append, draw = real_clicks()
    res["real_64_blocks_append_ms"] = summary(append, 300)
    res["real_64_blocks_redraw_ms"] = summary(draw, 100)
    for length in (5, 20, 100):
        res[f"real_travel_after_{length}_ops"] = travel(length)
    res["figure_json_kb"] = {f"{nb}_blocks": figure_kb(nb) for nb in (64, 256, 1024, 4096)}
    res["figure_json_kb"]["target_1024"] = 300
    res["machine"]["load_average_at_end"] = os.getloadavg()
    print(json.dumps(res, indent=1))
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
