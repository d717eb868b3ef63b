"""The engine's host path on a CPU: a dry serving step with 256 running sequences, and a
sampled step against a greedy one on tiny-random (the CPU targets of issue 13).

Best of several repeats of a few steps each (the steps are the same kind: every sequence
decodes one token); the machine's load average is recorded with the result, because on a
shared machine the other processes set the noise floor.

    python bench/engine_host.py --out bench/results/engine_host.json
    python bench/engine_host.py --smoke --out /tmp/host.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402


def best_step_ms(eng: LLMEngine, repeats: int, steps: int) -> tuple[float, float]:
    """(wall, CPU time of this process) per step, each the best of the repeats. On a machine
    others load, the CPU time is the steadier measure of the work itself."""
    wall = cpu = float("inf")
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        for _ in range(steps):
            eng.step()
        wall = min(wall, (time.perf_counter() - t) / steps)
        cpu = min(cpu, (time.process_time() - c) / steps)
    return 1e3 * wall, 1e3 * cpu


def running_engine(model: str | None, requests: int, params: SamplingParams, blocks: int
                   ) -> LLMEngine:
    eng = LLMEngine(EngineConfig(model=model, block_size=16, num_gpu_blocks=blocks, device="cpu"))
    rng = random.Random(0)
    for _ in range(requests):
        prompt = [rng.randrange(1, 200) for _ in range(rng.randint(20, 60))]
        eng.add_request(prompt if model else "x" * len(prompt), params)
    while eng.scheduler.waiting:
        eng.step()
    eng.step()
    return eng


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/engine_host.json")
    ap.add_argument("--smoke", action="store_true", help="fewer sequences and repeats")
    args = ap.parse_args()
    n, reps = (32, 2) if args.smoke else (256, 7)
    torch.set_num_threads(1)  # one core each: process time is then the step's own cost
    result: dict = {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                    "load_average_before": os.getloadavg(), "running_sequences": n}
    long = dict(max_tokens=400, ignore_eos=True)
    for name, sp in (("greedy", SamplingParams(**long)),
                     ("sampled", SamplingParams(temperature=0.8, top_p=0.95, **long))):
        eng = running_engine(None, n, sp, 8192)
        result[f"dry_step_ms_{name}"], result[f"dry_step_cpu_ms_{name}"] = best_step_ms(eng, 3 * reps, 10)
    result["dry_step_us_per_sequence"] = 1e3 * result["dry_step_ms_greedy"] / n
    groups = max(1, n // 8)
    for name, sp in (("greedy", SamplingParams(n=8, **long)),
                     ("temperature", SamplingParams(n=8, temperature=0.8, **long)),
                     ("temperature_top_p", SamplingParams(n=8, temperature=0.8, top_p=0.95, **long))):
        eng = running_engine("tiny-random", groups, sp, 4096)
        result[f"tiny_random_step_ms_{name}"], result[f"tiny_random_step_cpu_ms_{name}"] = \
            best_step_ms(eng, max(2, reps // 2), 3)
    for kind in ("", "cpu_"):
        g = result[f"tiny_random_step_{kind}ms_greedy"]
        for name in ("temperature", "temperature_top_p"):
            result[f"tiny_random_{name}_over_greedy_{kind or 'wall_'}time"] = \
                result[f"tiny_random_step_{kind}ms_{name}"] / g
    result["load_average_after"] = os.getloadavg()
    print(json.dumps(result, indent=1))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
