"""The tier's copies with whole slots and with layer parts, side by side on one GPU (run 54's
diagnostic): each way's time for a 1B-shaped prefix of `--blocks` blocks, the gather's layout,
and each bus copy alone on CUDA events.

    python bench/tier_parts_probe.py --out "$OUT/tier_parts_probe.json"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from engine.runtime.tier_copies import TierCopies, _gather


def one(parts: int, blocks: int) -> dict:
    os.environ["PAGEDLAB_TIER_PARTS"] = str(parts)
    kv = torch.randn((16, 2, 2 * blocks + 8, 16, 8, 64), device="cuda", dtype=torch.bfloat16)
    tier = TierCopies(kv, blocks)
    staged = _gather(kv, list(range(blocks)), parts)
    out_ms, in_ms, call_ms = [], [], []
    for _ in range(6):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tier.offload(kv, [(b, b) for b in range(blocks)])
        call_ms.append(1e3 * (time.perf_counter() - t0))
        tier.read(blocks - 1)
        out_ms.append(1e3 * (time.perf_counter() - t0))
        t0 = time.perf_counter()
        tier.load(kv, [(s, blocks + s) for s in range(blocks)])
        tier.wait_for_blocks(range(blocks, 2 * blocks))
        torch.cuda.synchronize()
        in_ms.append(1e3 * (time.perf_counter() - t0))
    same = bool(torch.equal(kv[:, :, :blocks], kv[:, :, blocks:2 * blocks]))
    # each D2H copy of a part alone, on events
    host = tier.slots
    per_copy = []
    for part in range(parts):
        src = staged[part]
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        host[part, :blocks].copy_(src, non_blocking=True)
        b.record()
        b.synchronize()
        per_copy.append(round(a.elapsed_time(b), 3))
    nbytes = blocks * tier.slot_bytes
    return {"parts": parts, "staged_contiguous": staged.is_contiguous(),
            "staged_strides": list(staged.stride()), "part_contiguous": staged[0].is_contiguous(),
            "out_ms": round(statistics.median(out_ms[1:]), 3),
            "out_call_ms": round(statistics.median(call_ms[1:]), 3),
            "in_ms": round(statistics.median(in_ms[1:]), 3),
            "out_gb_s": round(nbytes / statistics.median(out_ms[1:]) / 1e6, 1),
            "in_gb_s": round(nbytes / statistics.median(in_ms[1:]) / 1e6, 1),
            "d2h_part_copy_ms": per_copy, "same_bytes_back": same}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    got = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "runs": [one(p, args.blocks) for p in (1, 4, 1, 4)]}
    print(json.dumps(got, indent=1), flush=True)
    with open(args.out, "w") as f:
        json.dump(got, f, indent=1)


if __name__ == "__main__":
    main()
