"""The batched sampler alone on a GPU: one step's draw for 256 rows of a 49,152-token vocabulary
(random logits of a flat-ish spread, the shape of SmolLM2's), greedy vs temperature vs
temperature + top-p, wall time per step including the one read back.

    python bench/sampler_micro.py --out bench/results/sampler_micro.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.sampler import TorchScores  # noqa: E402
from engine.sampler_keys import SampleRequest, request_key, sample_uniform  # noqa: E402
from engine.sequence import SamplingParams  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/sampler_micro.json")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=49152)
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    logits = torch.randn(args.rows, args.vocab, device=dev) * 0.5
    lp = torch.log_softmax(logits, -1)
    best = lp.argmax(-1)
    result = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
              "rows": args.rows, "vocab": args.vocab, "torch": torch.__version__}
    for name, sp in (("greedy", SamplingParams()), ("temperature", SamplingParams(temperature=0.8)),
                     ("temperature_top_p", SamplingParams(temperature=0.8, top_p=0.95)),
                     ("top_k_top_p", SamplingParams(temperature=0.8, top_k=50, top_p=0.95))):
        times = []
        for step in range(30):
            reqs = [SampleRequest(i, sp, sample_uniform(request_key(i), 0, step))
                    for i in range(args.rows)]
            scores = TorchScores(logits, lp, (best, lp.gather(1, best[:, None])[:, 0]))
            if dev == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            scores.sample_many(reqs)
            times.append(time.perf_counter() - t)
        times = sorted(times[5:])
        result[f"{name}_ms"] = 1e3 * times[len(times) // 2]
        print(name, round(result[f"{name}_ms"], 3), "ms", flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
