"""The tier's copy out, taken apart on the GPU: the offload's gather in three ways (one index of
the block-major pool as before the parts; one index of the parted pool on its second dimension;
one index a part on its first) and the copy to pinned memory in one piece or four, each timed
alone with CUDA events on a 1B-shaped pool (16 layers, 8 KV heads, head_dim 64, bf16, 16-token
blocks: 0.5 MB a block).

    python bench/tier_copy_probe.py "$OUT/tier_copy_probe.json"      # a GPU
"""
from __future__ import annotations

import json
import statistics
import sys

import torch


def timed(fn, rounds: int = 9, stream=None) -> float:
    """The median device time of fn (ms) on `stream` (the current one if None), after one
    warm-up, each round after the device is idle."""
    times = []
    for _ in range(rounds + 1):
        torch.cuda.synchronize()
        with torch.cuda.stream(stream or torch.cuda.current_stream()):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return round(statistics.median(times[1:]), 3)


def main(path: str) -> None:
    blocks, n, parts = 600, 128, 4
    kv = torch.randn((16, 2, blocks, 16, 8, 64), device="cuda").to(torch.bfloat16)
    idx = torch.arange(0, 2 * n, 2, device="cuda")
    by_part = kv.view(parts, 16 // parts, *kv.shape[1:])
    staged = kv.permute(2, 0, 1, 3, 4, 5)[idx]
    host = torch.empty(staged.shape, dtype=staged.dtype, pin_memory=True)
    mb = staged.numel() * staged.element_size() / 1e6
    got = {
        "megabytes": mb,
        "gather_ms": {
            "whole_first_dim": timed(lambda: kv.permute(2, 0, 1, 3, 4, 5)[idx]),
            "parted_second_dim": timed(lambda: by_part.permute(0, 3, 1, 2, 4, 5, 6)[:, idx]),
            "parted_second_dim_contiguous": timed(
                lambda: by_part.permute(0, 3, 1, 2, 4, 5, 6)[:, idx].contiguous()),
            "a_part_first_dim": timed(lambda: [p.permute(2, 0, 1, 3, 4, 5)[idx] for p in by_part]),
        },
        "to_host_ms": {
            "one_copy": timed(lambda: host.copy_(staged, non_blocking=True)),
            "four_copies": timed(lambda: [h.copy_(s, non_blocking=True) for h, s in
                                          zip(host.chunk(parts), staged.chunk(parts), strict=True)]),
        },
    }
    print(json.dumps(got, indent=1))
    with open(path, "w") as f:
        json.dump(got, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tier_copy_probe.json")
