"""Dry-mode bookkeeping speed on a 4096-block pool: appends/s, fork+free/s, snapshot, replay.

A benchmark, not a test: it prints a table and writes bench/results/bookkeeping.json.
Targets (2-core CPU): >= 200,000 single-token appends/s; snapshot of a 4096-block pool <= 5 ms;
replay of a 1,000-operation trace <= 50 ms.

    python bench/bookkeeping.py [--out bench/results/bookkeeping.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.measure import seconds_of  # noqa: E402
from engine import EngineConfig, LLMEngine  # noqa: E402

NUM_BLOCKS, BLOCK_SIZE = 4096, 16


def fresh(**kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=None, block_size=BLOCK_SIZE, num_gpu_blocks=NUM_BLOCKS, **kw))


def best_of(fn, repeats: int = 5) -> float:
    """Best wall time of several runs: the least disturbed by other work on the machine."""
    return min(seconds_of(fn, repeats))


def bench_appends() -> dict[str, float]:
    n_calls = 50_000

    def one_token_calls() -> None:
        eng = fresh()
        seqs = [eng.add_sequence([1, 2, 3]) for _ in range(16)]
        for i in range(n_calls):
            eng.append(seqs[i & 15], token_ids=[7])

    def one_call_many_tokens() -> None:
        eng = fresh()
        for _ in range(16):
            eng.append(eng.add_sequence([1, 2, 3]), n=n_calls // 16)

    return {
        "append_calls_per_s (append(seq, token_ids=[t]) one call per token)":
            n_calls / best_of(one_token_calls),
        "appended_tokens_per_s (append(seq, n=3125), 16 seqs, seeded tokens)":
            n_calls / best_of(one_call_many_tokens),
    }


def bench_fork_free() -> dict[str, float]:
    eng = fresh()
    parent = eng.add_sequence([t % 256 for t in range(64 * BLOCK_SIZE + 8)])  # a 65-block table
    n = 5_000

    def loop() -> None:
        for _ in range(n):
            eng.free(eng.fork(parent))

    return {"fork_plus_free_per_s (65-block table)": n / best_of(loop)}


def full_pool_engine() -> LLMEngine:
    """Every one of the 4096 blocks used: 256 sequences of 16 blocks, half of them forked."""
    eng = fresh()
    rng = random.Random(0)
    for _ in range(128):
        s = eng.add_sequence([rng.randrange(256) for _ in range(16 * 16 - 3)])
        c = eng.fork(s)
        eng.append(c, n=3)  # copy-on-write of the shared tail
        eng.append(s, n=3 + 16 * 15)
    return eng


def bench_snapshot() -> dict[str, float]:
    eng = full_pool_engine()
    assert eng.snapshot().metrics.used_blocks == NUM_BLOCKS, eng.snapshot().metrics
    seq = next(iter(eng.seqs))

    times_after_op = []
    for _ in range(200):
        eng.free(eng.fork(seq))
        t0 = time.perf_counter()
        eng.snapshot()
        times_after_op.append(time.perf_counter() - t0)
    cold = []
    for _ in range(20):
        eng.kv.pool.forget_changes()  # as if every block had changed
        eng._snapshots._seqs.clear()
        t0 = time.perf_counter()
        eng.snapshot()
        cold.append(time.perf_counter() - t0)
    return {
        "snapshot_ms_after_an_op (median, 4096 used blocks, 256 seqs)":
            1e3 * statistics.median(times_after_op),
        "snapshot_ms_cold (median, every block and sequence rebuilt)": 1e3 * statistics.median(cold),
    }


def thousand_op_trace() -> list[dict]:
    eng = fresh()
    rng = random.Random(1)
    while len(eng.trace) < 1000:
        live = sorted(eng.seqs)
        r = rng.random()
        if not live or r < 0.2:
            eng.add_sequence([rng.randrange(4) for _ in range(rng.randrange(1, 64))])
        elif r < 0.35:
            eng.fork(rng.choice(live))
        elif r < 0.45 and len(live) > 4:
            eng.free(rng.choice(live))
        else:
            eng.append(rng.choice(live), n=rng.randrange(1, 32))
    return eng.trace


def bench_replay() -> dict[str, float]:
    trace = thousand_op_trace()
    cfg = fresh().config
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        LLMEngine.replay(cfg, trace)
        times.append(time.perf_counter() - t0)
    return {"replay_ms_1000_ops (median)": 1e3 * statistics.median(times)}


TARGETS = {
    "append_calls_per_s": (">=", 200_000),
    "appended_tokens_per_s": (">=", 200_000),
    "snapshot_ms_after_an_op": ("<=", 5.0),
    "snapshot_ms_cold": ("<=", 5.0),
    "replay_ms_1000_ops": ("<=", 50.0),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/bookkeeping.json")
    args = parser.parse_args()
    results: dict[str, float] = {}
    for bench in (bench_appends, bench_fork_free, bench_snapshot, bench_replay):
        results.update(bench())
    rows = []
    for name, value in results.items():
        key = name.split(" ")[0]
        target = TARGETS.get(key)
        ok = "" if target is None else ("met" if (value >= target[1] if target[0] == ">=" else
                                                  value <= target[1]) else "MISSED")
        goal = "" if target is None else f"{target[0]} {target[1]:g}"
        rows.append({"metric": name, "value": round(value, 3), "target": goal, "status": ok})
        print(f"{name:<72} {value:>14,.3f}  {goal:>10} {ok}")
    out = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count()},
        "pool": {"num_blocks": NUM_BLOCKS, "block_size": BLOCK_SIZE},
        "results": rows,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
