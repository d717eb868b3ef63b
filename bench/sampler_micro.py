"""The batched sampler alone: one step's draw for 256 rows of a 49,152-token vocabulary (random
logits of a flat-ish spread, the shape of SmolLM2's), greedy vs temperature vs temperature +
top-p vs top-k + top-p, wall time per step including the one read back.

On a GPU the step's scores come as the decode graph leaves them (float32 logits and the greedy
choice, no log_softmax), and each case is timed on both paths: the fused Triton kernel
(`<case>_ms`, what the engine uses there) and the plain-torch `draw` (`<case>_torch_ms`). On a
CPU only the torch path runs (with a workspace, as the model runner gives it).

    python bench/sampler_micro.py --out bench/results/sampler_micro.json     # on the GPU
    python bench/sampler_micro.py --smoke --out /tmp/sampler_micro.json      # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.core.sampler_keys import SampleRequest, request_key, sample_uniform  # noqa: E402
from engine.core.sequence import SamplingParams  # noqa: E402
from engine.runtime.sampler import SamplerWorkspace, TorchScores, fused_sampling_available, greedy_pair  # noqa: E402

CASES = (("greedy", SamplingParams()), ("temperature", SamplingParams(temperature=0.8)),
         ("temperature_top_p", SamplingParams(temperature=0.8, top_p=0.95)),
         ("top_k_top_p", SamplingParams(temperature=0.8, top_k=50, top_p=0.95)))


def step_ms(logits: torch.Tensor, greedy: tuple[torch.Tensor, torch.Tensor] | None,
            sp: SamplingParams, fused: bool, steps: int) -> float:
    """Median wall time of one step's `sample_many` over `steps` steps (the first few dropped:
    compiling, allocator warm-up)."""
    workspace = SamplerWorkspace()
    times = []
    for step in range(steps + 5):
        reqs = [SampleRequest(i, sp, sample_uniform(request_key(i), 0, step))
                for i in range(logits.shape[0])]
        scores = TorchScores(logits, None, greedy, workspace=workspace, fused=fused)
        if logits.is_cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        scores.sample_many(reqs)
        times.append(time.perf_counter() - t)
    times = sorted(times[5:])
    return 1e3 * times[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results/sampler_micro.json")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--steps", type=int, default=25, help="timed steps per case (median)")
    ap.add_argument("--smoke", action="store_true", help="16 rows x 4,096 tokens, 3 steps")
    args = ap.parse_args()
    if args.smoke:
        args.rows, args.vocab, args.steps = 16, 4096, 3
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cpu":  # one core, as bench/engine_host.py: a second thread that another
        torch.set_num_threads(1)  # process holds makes a small step wait ~16 ms for it
    torch.manual_seed(0)
    logits = torch.randn(args.rows, args.vocab, device=dev) * 0.5
    # as the decode graph leaves a step on a GPU; on a CPU the greedy choice waits for a row
    greedy = greedy_pair(logits) if dev.type == "cuda" else None
    paths = {"": fused_sampling_available(dev)}
    if paths[""]:
        paths["_torch"] = False
    result = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
              "rows": args.rows, "vocab": args.vocab, "torch": torch.__version__, "smoke": args.smoke,
              "path": "fused triton kernel" if paths[""] else "torch draw"}
    for name, sp in CASES:
        for suffix, fused in paths.items():
            ms = step_ms(logits, greedy, sp, fused, args.steps)
            result[f"{name}{suffix}_ms"] = ms
            print(f"{name}{suffix or ''}", round(ms, 3), "ms", flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
