"""The CPU backend's attention, vectorised (paged_kernels/torch_attention.py) against the reference loop
(paged_kernels/reference.py), inside real engine steps.

One engine, one process: steps alternate between the two attention functions (the order flips
every round), so both see the same machine load, which on a shared machine moves more than
the difference being measured. Reports the median wall and process time per step.

    python bench/cpu_attention.py                       # tiny-random, 256 decoding sequences
    python bench/cpu_attention.py --model default --seqs 64
    python bench/cpu_attention.py --model default --single   # the playground's one-token append
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.engine_host import running_engine  # noqa: E402
from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from paged_kernels import reference  # noqa: E402


def engine_and_step(model: str, seqs: int, single: bool) -> tuple[LLMEngine, Callable[[], object]]:
    if single:
        eng = LLMEngine(EngineConfig(model=model, block_size=16, num_gpu_blocks=256, device="cpu"))
        seq = eng.add_sequence("Four score and seven years ago our fathers brought forth")
        return eng, lambda: eng.append(seq, n=1)
    eng = running_engine(model, seqs, SamplingParams(max_tokens=1000, ignore_eos=True), 2048)
    return eng, eng.step


def alternate(eng: LLMEngine, step: Callable[[], object], rounds: int) -> dict:
    """Median ms per step of each attention, steps interleaved."""
    cache = eng.runtime.cache
    variants = {"vectorised": cache.ops,
                "loop": dataclasses.replace(cache.ops, paged_attention=reference.paged_attention)}
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in variants}
    for r in range(rounds):
        for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            cache.ops = variants[name]
            wall, cpu = time.perf_counter(), time.process_time()
            step()
            times[name][0].append(1e3 * (time.perf_counter() - wall))
            times[name][1].append(1e3 * (time.process_time() - cpu))
    cache.ops = variants["vectorised"]
    return {name: {"wall_ms": round(statistics.median(w), 1), "cpu_ms": round(statistics.median(c), 1)}
            for name, (w, c) in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--single", action="store_true", help="one sequence, one-token appends")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="1: process time is the step's cost")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    eng, step = engine_and_step(args.model, args.seqs, args.single)
    step()  # warm
    result = {"model": args.model, "seqs": 1 if args.single else args.seqs, "threads": args.threads,
              "load_average_before": os.getloadavg()}
    result.update(alternate(eng, step, args.rounds))
    result["load_average_after"] = os.getloadavg()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
