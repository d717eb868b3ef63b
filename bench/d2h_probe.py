"""Why the tier's copies to the host ran at a third of the bus (runs 55-56: 12.7-18.7 GB/s
against the bus's 54.6, run 54's H100 at 42-49): the copy out timed piece by piece on CUDA
events, in an engine as `bench/tier.py`'s bandwidth builds it and in a `TierCopies` alone, so
that the source (the gather's output), the destination (the tier's pinned slots), the stream
and the engine around them can each be told apart.

    python bench/d2h_probe.py --out "$OUT/d2h_probe.json"      # on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.tier_copy_probe import timed  # noqa: E402
from engine.runtime.tier_copies import TierCopies, _gather  # noqa: E402

BLOCKS = 128  # bench/tier.py's bandwidth: 64 MB of a Llama-1B shape


def pieces(tier: TierCopies, kv: torch.Tensor) -> dict:
    """Each way of making the copy out, ms and GB/s: which piece is slow."""
    n, parts = BLOCKS, tier.parts
    staged = _gather(kv, list(range(n)), parts)
    fresh_dev = torch.empty_like(staged).normal_()
    fresh_host = torch.empty(staged.shape, dtype=staged.dtype, pin_memory=True)
    nbytes = staged.numel() * staged.element_size()
    low, default = tier._offload_stream, torch.cuda.current_stream()

    def by_part(dst: torch.Tensor, src: torch.Tensor) -> Callable[[], None]:
        return lambda: [dst[p, :n].copy_(src[p], non_blocking=True) for p in range(parts)]

    ways = {
        "gather": (lambda: _gather(kv, list(range(n)), parts), default),
        "staged_to_slots_low_stream": (by_part(tier.slots, staged), low),
        "staged_to_slots_default_stream": (by_part(tier.slots, staged), default),
        "fresh_device_to_slots": (by_part(tier.slots, fresh_dev), low),
        "staged_to_fresh_pinned": (by_part(fresh_host, staged), low),
        "staged_to_fresh_pinned_one_copy": (lambda: fresh_host.copy_(staged, non_blocking=True), low),
        "slots_to_device_back": (by_part(fresh_dev, tier.slots), default),
    }
    out: dict[str, Any] = {"parts": parts, "bytes": nbytes,
                           "slots_pinned": tier.slots.is_pinned(),
                           "staged_contiguous": staged.is_contiguous(),
                           "slots_ptr_mod_4096": tier.slots.data_ptr() % 4096,
                           "fresh_host_ptr_mod_4096": fresh_host.data_ptr() % 4096}
    for name, (copy, stream) in ways.items():
        ms = timed(copy, rounds=5, stream=stream)
        out[name] = {"ms": ms, "gb_s": round(nbytes / ms / 1e6, 1)}
    out["offload_call_to_last_byte_ms"] = _offload_wall(tier, kv)
    return out


def _offload_wall(tier: TierCopies, kv: torch.Tensor) -> float:
    """As bench/tier.py's bandwidth times it: the call to the last slot's bytes on the host."""
    times = []
    for _ in range(6):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tier.offload(kv, [(b, b) for b in range(BLOCKS)])
        tier.read(BLOCKS - 1)
        times.append(1e3 * (time.perf_counter() - t0))
    return round(statistics.median(times[1:]), 3)


class _TimedEvent(torch.cuda.Event):
    """An event the tier's copies record that can also be timed (the probe swaps it in)."""

    def __new__(cls, *args: Any, **kw: Any) -> _TimedEvent:
        return super().__new__(cls, enable_timing=True)


def alternating(cache: Any, rounds: int = 6) -> dict:
    """bench/tier.py's bandwidth loop (an offload, its last byte read, a load of the same slots,
    a sync) with the offload's device side on events: from the call to the last slot's copy on
    the device, against the host's wall time to it. Is the copy slow on the device, or late?"""
    n, tier = BLOCKS, cache.tier
    saved, torch.cuda.Event = torch.cuda.Event, _TimedEvent
    rows = []
    try:
        for _ in range(rounds):
            torch.cuda.synchronize()
            start = torch.cuda.Event()
            start.record()
            t0 = time.perf_counter()
            cache.offload([(b, b) for b in range(n)])
            call = time.perf_counter() - t0
            done = tier._slot_event[n - 1]
            tier.read(n - 1)
            wall = time.perf_counter() - t0
            rows.append({"call_ms": round(1e3 * call, 3), "wall_ms": round(1e3 * wall, 3),
                         "device_ms": round(start.elapsed_time(done), 3)})
            cache.load([(s, n + s) for s in range(n)])
            cache.wait_for_loads([list(range(n, 2 * n))])
            torch.cuda.synchronize()
    finally:
        torch.cuda.Event = saved
    return {"rounds": rows, **{k: statistics.median(r[k] for r in rows[1:])
                               for k in ("call_ms", "wall_ms", "device_ms")}}


def in_engine() -> dict:
    """The tier of an engine of a random Llama-1B shape, as the bench's bandwidth makes it."""
    from bench import mem_models, tier

    folder = Path(tempfile.mkdtemp(prefix="d2h-"))
    tok, _ = mem_models.tokenizer()
    path = mem_models.build("one_b", folder, tok, "cuda")
    eng = tier.engine(path, "cuda", 3 * BLOCKS, BLOCKS)
    cache = eng.runtime.cache
    cache.kv_cache.normal_()
    got = {"alternating_first": alternating(cache), **pieces(cache.tier, cache.kv_cache),
           "alternating_after": alternating(cache)}
    eng.close()
    return got


def alone() -> dict:
    """A TierCopies of its own over a pool of the same shape (bench/tier_parts_probe.py's)."""
    kv = torch.randn((16, 2, 2 * BLOCKS + 8, 16, 8, 64), device="cuda", dtype=torch.bfloat16)
    return pieces(TierCopies(kv, BLOCKS), kv)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    got = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "parts_env": os.environ.get("PAGEDLAB_TIER_PARTS", ""),
           "alone": alone(), "in_engine": in_engine(), "alone_after": alone()}
    print(json.dumps(got, indent=1), flush=True)
    Path(args.out).write_text(json.dumps(got, indent=1))


if __name__ == "__main__":
    main()
