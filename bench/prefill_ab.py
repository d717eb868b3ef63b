"""Do the prefill graphs cost the tier's rows anything? (issue 44, after run 42: the tier's document
repeat read 6.8 ms against run 40's 5.6, and its recompute 20.8 against 18.5, on hosts as fast.)

    python bench/prefill_ab.py --out "$OUT/prefill_ab.json"        # one GPU: ~2 minutes
    python bench/prefill_ab.py --smoke --out /tmp/prefill_ab.json   # a CPU: the script runs

Four engines of the Llama-1B shape (bench/mem_models.py), with the CPU tier and without, with the
prefill graphs and without (this diagnostic switches them off in its own engines after their
warm-up), run bench/tier.py's document cycle by turns: the repeat's wall time of each, by round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench import hybrid, mem_models, tier  # noqa: E402
from bench.host_speed import python_ms  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sizes = tier.SMOKE if args.smoke else tier.FULL
    rounds = 3 if args.smoke else 9
    tok, _ = mem_models.tokenizer()
    path = mem_models.build("one_b", Path(tempfile.mkdtemp(prefix="ab-")), tok, args.device,
                            2 if args.smoke else None)
    engines = {}
    for slots in (512, 0):
        for graphs in (True, False):
            eng = tier.engine(path, args.device, sizes["pool"], slots)
            if not graphs and eng.runtime.runner.prefill is not None:
                eng.runtime.runner.prefill.ready = False  # the eager path, as before run 41
            engines[("tier" if slots else "recompute", graphs)] = eng
    doc = hybrid._prompts(1, sizes["doc"], sizes["doc"], 4)[0]
    evictor = hybrid._prompts(1, sizes["evictor"], sizes["evictor"], 5)[0]
    times: dict = {key: [] for key in engines}
    for r in range(rounds + 1):
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        for key in order:
            eng = engines[key]
            eng.generate([doc + [7, 8, 9, 10 + r]], tier.ONE)
            eng.generate([evictor[r:] + evictor[:r]], tier.ONE)
            tier.sync(args.device)
            t0 = time.perf_counter()
            eng.generate([doc + [11, 12, 13, 14 + r]], tier.ONE)
            tier.sync(args.device)
            if r:
                times[key].append(round(1e3 * (time.perf_counter() - t0), 3))
    out = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
           "python_ms": python_ms(), "rounds": rounds,
           "median_ms": {f"{k[0]}, prefill graphs {'on' if k[1] else 'off'}":
                         statistics.median(v) for k, v in times.items()},
           "runs_ms": {f"{k[0]}, prefill graphs {'on' if k[1] else 'off'}": v
                       for k, v in times.items()}}
    for eng in engines.values():
        eng.close()
    print(json.dumps(out["median_ms"]), flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
