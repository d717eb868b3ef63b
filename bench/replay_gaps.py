"""Is the 1.2B decode step's device time its graph's? (issue 44's roofline rows)

Run 66 (a fast H100 host) stepped the 256-sequence engine at 3.41 ms a step with the host
waiting 0.84 ms a step for the device, where `bench/device_step.py` times the decode graph,
replayed alone, at ~2.9 ms: the device does ~0.5 ms a step more in the engine's loop than the
graph alone takes. This times, on the device, each graph replay of the engine's steady steps
(a CUDA event before and after each `CUDAGraph.replay`) and what lies between two replays (the
step's other kernels and copies, and any idle), then the same graph replayed alone, back to
back, as `device_step` does.

    python bench/replay_gaps.py --out "$OUT/replay_gaps.json"
    python bench/replay_gaps.py --smoke --out /tmp/gaps.json     # a CPU: the script runs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench import device_step, mem_models  # noqa: E402

FULL = dict(seqs=[256, 64], prompt=512, new=96)
SMOKE = dict(seqs=[4], prompt=48, new=16)


class ReplayClock:
    """CUDA events around every `CUDAGraph.replay` while on (a GPU only)."""

    def __init__(self) -> None:
        self.pairs: list[tuple[Any, Any]] = []
        self.on = True
        self._replay = torch.cuda.CUDAGraph.replay
        clock = self

        def timed(graph: torch.cuda.CUDAGraph) -> None:
            if not clock.on:
                clock._replay(graph)
                return
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            clock._replay(graph)
            end.record()
            clock.pairs.append((start, end))

        torch.cuda.CUDAGraph.replay = timed

    def close(self) -> dict[str, float | int]:
        """Stop timing; the replays' device times and the gaps between them (ms, medians of the
        steady replays: the first and last few of a run aside)."""
        torch.cuda.CUDAGraph.replay = self._replay
        torch.cuda.synchronize()
        pairs = self.pairs[3:-3]
        inside = [s.elapsed_time(e) for s, e in pairs]
        between = [e.elapsed_time(s2) for (_, e), (s2, _) in zip(pairs[:-1], pairs[1:], strict=True)]
        return {"replays": len(pairs), "replay_ms": round(statistics.median(inside), 4),
                "replay_ms_by_step": [round(t, 3) for t in inside[::8]],
                "between_ms": round(statistics.median(between), 4),
                "step_ms": round(statistics.median(
                    [a + b for a, b in zip(inside[:-1], between, strict=True)]), 4)}


def burst(eng: Any, n: int, times: int = 200) -> list[float] | None:
    """The graph of n sequences replayed `times` times back to back, each timed on the device:
    the medians of each tenth of the burst (a GPU slowing as it stays busy shows as a rise)."""
    graphs = eng.runtime.runner.graphs
    key = (graphs.bucket(n), 1)
    if key not in graphs.graphs:
        return None
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(times)]
    for start, end in events:
        start.record()
        graphs.graphs[key].replay()
        end.record()
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in events]
    tenth = times // 10
    return [round(statistics.median(ms[i:i + tenth]), 3) for i in range(0, times, tenth)]


def part(path: str, device: str, sizes: dict, n: int) -> dict:
    eng = device_step.decoding(path, device, n, sizes["prompt"], sizes["new"])
    out: dict[str, Any] = {}
    if device == "cuda":
        clock = ReplayClock()
        for _ in range(sizes["new"] // 2):
            eng.step()
        # mid-run, on this step's inputs: the graph alone, back to back (its replays rewrite
        # the same K/V into the same slots)
        torch.cuda.synchronize()
        clock.on = False
        out["alone_mid_run_ms"] = burst(eng, n, 20)
        clock.on = True
        while eng.has_pending_work():
            eng.step()
        out["in_loop"] = clock.close()
        # the same graph replayed back to back on the last step's inputs (device_step's
        # measure), then a longer burst: does it slow down as the loop's steps go on?
        out["alone_ms"] = device_step._replay_ms(eng, n)
        out["alone_burst_ms"] = burst(eng, n)
    else:
        while eng.has_pending_work():
            eng.step()
    eng.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="two layers, tiny sizes (a CPU check)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sizes = SMOKE if args.smoke else FULL
    tok, _ = mem_models.tokenizer()
    path = mem_models.build("one_b", Path(tempfile.mkdtemp(prefix="gaps-")), tok, args.device,
                            2 if args.smoke else None)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name() if args.device == "cuda"
                              else "cpu", "torch": torch.__version__}
    for n in sizes["seqs"]:
        result[str(n)] = part(path, args.device, sizes, n)
        print(json.dumps({"seqs": n, **result[str(n)]}), flush=True)
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
