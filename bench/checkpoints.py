"""How long a checkpoint takes to take and to restore: the page takes one every 8 operations and
restores one when the visitor acts after Back (ui/session.py), so both sit on a click's path.

Two engines: the dry mode on a full 4096-block pool (bench/bookkeeping.py's: 256 sequences,
half of them forks, 16 blocks each) and the default model (SmolLM2-135M on the CPU, float32)
with a few sequences in a 64-block pool and swap space. Each time is the median and the minimum
of repeated calls (the machine is shared: the minimum is the least disturbed, the median the
usual); the machine's load average is recorded with them.

    python bench/checkpoints.py --out bench/results/checkpoints.json [--label after]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bookkeeping import full_pool_engine  # noqa: E402
from bench.measure import median_min_ms, save_labeled, seconds_of  # noqa: E402
from engine import EngineConfig, LLMEngine  # noqa: E402


def model_engine(sequences: int = 4) -> LLMEngine:
    """The default model with `sequences` sequences, a fork and an append each: four hold
    20-odd blocks of 64."""
    eng = LLMEngine(EngineConfig(model="default", block_size=16, num_gpu_blocks=64,
                                 num_cpu_blocks=64, preemption_mode="swap", device="cpu",
                                 dtype="float32"))
    for i in range(sequences):
        s = eng.add_sequence(f"Sequence {i}: four score and seven years ago our fathers brought")
        eng.append(eng.fork(s), n=4)
        eng.append(s, n=8)
    return eng


def measure(eng: LLMEngine, repeats: int) -> dict[str, object]:
    cp = eng.checkpoint()
    assert cp is not None
    used = eng.snapshot().metrics.used_blocks
    return {"used_blocks": used, "saved_kv_bytes": cp.kv_bytes,
            "take": median_min_ms(seconds_of(eng.checkpoint, repeats)),
            "restore": median_min_ms(seconds_of(lambda: eng.restore(cp), repeats))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/checkpoints.json")
    ap.add_argument("--label", default="after", help="the key this run is stored under")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--smoke", action="store_true", help="2 repeats, one sequence on the model")
    args = ap.parse_args()
    if args.smoke:
        args.repeats = 2
    run = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
           "load_average_before": os.getloadavg()}
    run["dry_4096_blocks"] = measure(full_pool_engine(), args.repeats)
    # --smoke: each of the model's sequences costs 13 forward passes on the CPU
    run["default_model_64_blocks"] = measure(model_engine(1 if args.smoke else 4), args.repeats)
    run["load_average_after"] = os.getloadavg()
    save_labeled(args.out, args.label, run)


if __name__ == "__main__":
    main()
