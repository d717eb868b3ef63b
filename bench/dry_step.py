"""A dry serving step with 256 running sequences, on the product's path and with the tests' content
oracle on (EngineConfig.track_kv_content): the target is at most 2 ms a step on the product's path.
`greedy_async_no_prefix_cache` is the 1.2B roofline engine's configuration (issue 44's 256 row,
whose step is the host's on a slow H100 host); `hybrid_decode_*` the hybrid rows' decode steps
(32 sequences of 1,024 tokens, a 128-token sliding group beside the full one, or none).

Each sample is the mean of a few steps (every sequence decodes one token); the median and the
minimum of the samples are kept, of wall time and of the process's CPU time, with the machine's
load average (a shared machine: the minimum is the least disturbed, the median the usual).
`--label before` on a checkout of the engine before a change gives the comparison beside it.

    python bench/dry_step.py --out bench/results/dry_step.json [--label after]
    python bench/dry_step.py --only greedy_async_no_prefix_cache --label after-1   # one row
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.measure import median_min_ms, save_labeled  # noqa: E402
from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402


def running_engine(requests: int, params: SamplingParams, **config: object) -> LLMEngine:
    """`requests` requests of 20-60 prompt tokens, every one of them decoding."""
    eng = LLMEngine(EngineConfig(model=None, block_size=16, num_gpu_blocks=8192, **config))
    rng = random.Random(0)
    for _ in range(requests):
        eng.add_request("x" * rng.randint(20, 60), params)
    while len(eng.requests()) != requests or any(r.status != "running" for r in eng.requests()):
        eng.step()
    eng.step()
    return eng


def decoding_hybrid(requests: int, prompt: int, window: int | None) -> LLMEngine:
    """`requests` prompts of `prompt` tokens decoding, async, no prefix cache (bench/mem_gpu.py's
    hybrid engines), with a sliding group of `window` tokens beside the full one (None: none)."""
    eng = LLMEngine(EngineConfig(model=None, block_size=16, max_num_seqs=requests,
                                 num_gpu_blocks=2 * requests * (prompt // 16 + 40) + 256,
                                 enable_prefix_caching=False, max_num_batched_tokens=32768,
                                 sliding_window=window, async_scheduling=True))
    rng = random.Random(0)
    for _ in range(requests):
        eng.add_request([rng.randrange(250) for _ in range(prompt)],
                        SamplingParams(max_tokens=600, ignore_eos=True))
    while eng.step().num_prefills or eng.scheduler.waiting:
        pass
    return eng


def step_ms(eng: LLMEngine, samples: int, steps: int) -> dict[str, dict[str, float]]:
    """Wall time and this process's CPU time a step (on a machine others load, the CPU time is
    the steadier measure of the work itself)."""
    wall, cpu = [], []
    for _ in range(samples):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            eng.step()
        wall.append((time.perf_counter() - t0) / steps)
        cpu.append((time.process_time() - c0) / steps)
    return {"wall": median_min_ms(wall), "cpu": median_min_ms(cpu)}


def configurations(sequences: int, smoke: bool) -> dict[str, Callable[[], LLMEngine]]:
    """Each measured configuration's engine, made when it is measured."""
    long = dict(max_tokens=400, ignore_eos=True)
    out: dict[str, Callable[[], LLMEngine]] = {}
    for name, sp in (("greedy", SamplingParams(**long)),
                     ("sampled", SamplingParams(temperature=0.8, top_p=0.95, **long))):
        for oracle, track in (("default", None), ("oracle_on", True), ("oracle_off", False)):
            out[f"{name}_{oracle}"] = partial(running_engine, sequences, sp, track_kv_content=track)
    # the GPU roofline engine's configuration (bench/device_step.py): async, no prefix cache
    out["greedy_async_no_prefix_cache"] = partial(
        running_engine, sequences, SamplingParams(**long), async_scheduling=True,
        enable_prefix_caching=False)
    # the hybrid rows' decode: 32 sequences of 1,024 tokens, a 128-token window or all full
    for name, window in (("hybrid_decode_window_128", 128), ("hybrid_decode_all_full", None)):
        out[name] = partial(decoding_hybrid, 4 if smoke else 32, 160 if smoke else 1024, window)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/dry_step.json")
    ap.add_argument("--label", default="after", help="the key this run is stored under")
    ap.add_argument("--sequences", type=int, default=256)
    ap.add_argument("--samples", type=int, default=21)
    ap.add_argument("--only", nargs="+", help="these configurations only (default: all)")
    ap.add_argument("--smoke", action="store_true", help="32 sequences, 3 samples")
    args = ap.parse_args()
    if args.smoke:
        args.sequences, args.samples = 32, 3
    run: dict = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
                 "running_sequences": args.sequences, "load_average_before": os.getloadavg()}
    for name, make in configurations(args.sequences, args.smoke).items():
        if not args.only or name in args.only:
            run[name] = step_ms(make(), args.samples, 10)
    run["load_average_after"] = os.getloadavg()
    save_labeled(args.out, args.label, run)


if __name__ == "__main__":
    main()
