"""Where a decode step's GPU time goes: the kernels of one eager decode forward (the work a
CUDA graph replays), by name, against the graph replay's own time. The difference is what the
graph's ~300 nodes cost beyond their kernels (each node's launch inside the graph).

    python bench/decode_profile.py --model /tmp/smollm2 --batch 64 --out bench/results/decode_profile.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--context", type=int, default=192)
    ap.add_argument("--out", default="bench/results/decode_profile.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    result: dict = {"device": torch.cuda.get_device_name(), "context": args.context, "batches": {}}
    for n in args.batch:
        eng = LLMEngine(EngineConfig(model=args.model, device="cuda", dtype="bfloat16",
                                     num_gpu_blocks=n * (args.context // 16 + 2) + 16,
                                     max_num_seqs=n))
        for i in range(n):
            eng.add_request([10 + (i * 7 + j) % 1000 for j in range(args.context)],
                            SamplingParams(max_tokens=64, ignore_eos=True))
        while eng.scheduler.waiting:
            eng.step()
        eng.step()
        graphs = eng.runtime.runner.graphs
        size = graphs.bucket(n)
        replay = []
        for _ in range(30):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs.graphs[(size, 1)].replay()
            end.record()
            end.synchronize()
            replay.append(start.elapsed_time(end))
        graphs._compute(size, 1)  # eager, warm
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                graphs._compute(size, 1)
            torch.cuda.synchronize()
        by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                by_name[ev.name][0] += ev.device_time_total / 5 / 1e3  # ms per forward
                by_name[ev.name][1] += 1 / 5
        kernels_ms = sum(v[0] for v in by_name.values())
        top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:15]
        result["batches"][str(n)] = {
            "graph_replay_ms": statistics.median(replay),
            "kernels_sum_ms": kernels_ms,
            "kernel_launches": round(sum(v[1] for v in by_name.values())),
            "top": [{"kernel": k[:90], "ms": round(v[0], 4), "count": round(v[1])} for k, v in top],
        }
        print(n, json.dumps(result["batches"][str(n)])[:800], flush=True)
        del eng
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
