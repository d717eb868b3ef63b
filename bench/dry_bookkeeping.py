"""The block bookkeeping of issue 44's long prompts, alone: the dry engine (no tensors) runs the
tier's document repeat and the hybrid's 4,096-token prefill, so what is timed is the host's
allocation, eviction, hashing and writing of a long prompt's blocks. The heap is frozen first,
as a GPU engine freezes it after its warm-up (`--heap as-is`: not), and the collector's pauses
are counted.

    python bench/dry_bookkeeping.py --out bench/results/dry_bookkeeping.json
    python bench/dry_bookkeeping.py --smoke --out /tmp/dry.json

- `repeat`: `bench/tier.py`'s repeat (a 4,096-token document evicted by a 4,600-token prompt from
  a pool of 300 blocks, then asked again), with a tier of 512 slots and without: the wall time of
  the request asked again (median of the cycles after two).
- `prefill`: 32 prompts of 4,096 tokens, 8,192 tokens a step, async scheduling, with a 128-token
  sliding group beside the full one (a hybrid model: a block per group) and without: the host's
  time in steps that prefill (each of 3 runs), and the allocations and evictions of a run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import hybrid, tier  # noqa: E402
from bench.host_facts import host_cpus  # noqa: E402
from bench.measure import GcPauses  # noqa: E402
from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from engine.runtime.collector import settle_heap  # noqa: E402

FULL = dict(doc=4096, evictor=4600, pool=300, cycles=8, requests=32, prompt=4096, runs=3)
SMOKE = dict(doc=256, evictor=300, pool=24, cycles=3, requests=4, prompt=256, runs=2)
VOCAB = 250  # the dry mode's byte vocabulary, less its specials


def _ids(tokens: list[int]) -> list[int]:
    return [t % VOCAB for t in tokens]


def repeat(sizes: dict, slots: int) -> dict:
    eng = LLMEngine(EngineConfig(model=None, block_size=16, num_gpu_blocks=sizes["pool"],
                                 num_offload_blocks=slots, max_num_batched_tokens=8192,
                                 tier_store=tier.tier_store()))
    doc = _ids(hybrid._prompts(1, sizes["doc"], sizes["doc"], 4)[0])
    evictor = _ids(hybrid._prompts(1, sizes["evictor"], sizes["evictor"], 5)[0])
    walls = []
    for r in range(sizes["cycles"]):
        eng.generate([doc + [7, 8, 9, 10 + r]], tier.ONE)
        eng.generate([evictor[r:] + evictor[:r]], tier.ONE)
        t0 = time.perf_counter()
        eng.generate([doc + [11, 12, 13, 14 + r]], tier.ONE)
        walls.append(1e3 * (time.perf_counter() - t0))
    hits = eng.snapshot().metrics.offload_hit_blocks
    return {"median_ms": round(statistics.median(walls[2:]), 3),
            "runs_ms": [round(w, 3) for w in walls], "offload_hit_blocks": hits}


def prefill(sizes: dict, window: int | None) -> dict:
    n, plen = sizes["requests"], sizes["prompt"]
    blocks = (n * (-(-plen // 16) + 4) + 256) * (2 if window else 1)
    eng = LLMEngine(EngineConfig(model=None, block_size=16, num_gpu_blocks=blocks,
                                 max_num_batched_tokens=8192, max_num_seqs=n,
                                 sliding_window=window, async_scheduling=True))
    runs, evictions = [], 0
    for r in range(sizes["runs"]):
        for p in hybrid._prompts(n, plen, plen, 10 + r):
            eng.add_request(_ids(p), SamplingParams(max_tokens=8, ignore_eos=True))
        before, seconds = eng.snapshot().metrics.evictions, 0.0
        while eng.has_pending_work():
            t0 = time.perf_counter()
            result = eng.step()
            if result.num_prefills:
                seconds += time.perf_counter() - t0
        runs.append(round(seconds, 3))
        evictions = eng.snapshot().metrics.evictions - before
    return {"prefill_host_s": runs, "evictions_last_run": evictions}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", required=True)
    ap.add_argument("--heap", choices=["frozen", "as-is"], default="frozen",
                    help="the startup heap frozen first (as bench/mem_gpu.py), or not")
    args = ap.parse_args()
    sizes = SMOKE if args.smoke else FULL
    out: dict = {"host": host_cpus(), "sizes": sizes, "heap": args.heap}
    if args.heap == "frozen":  # as a GPU engine does after its warm-up (a dry one has none)
        settle_heap()
    with GcPauses() as pauses:
        out["repeat"] = {"tier": repeat(sizes, tier.REPEAT_TIER), "recompute": repeat(sizes, 0)}
    out["gc_pauses"] = {"repeat": pauses.summary()}
    with GcPauses() as pauses:
        out["prefill"] = {"hybrid": prefill(sizes, 128), "full": prefill(sizes, None)}
    out["gc_pauses"]["prefill"] = pauses.summary()
    print(json.dumps({"gc_pauses": out["gc_pauses"],
                      "repeat_ms": {k: v["median_ms"] for k, v in out["repeat"].items()},
                      "prefill_host_s": {k: v["prefill_host_s"] for k, v in out["prefill"].items()}}))
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
