"""The CPU tier at the speed of the bus (issue 32), measured: the copies' bandwidth each way, a
prompt whose prefix was evicted asked again (its blocks copied back against recomputed), and
what a load in flight costs the requests decoding beside it.

    python bench/tier.py --device cuda --out bench/results/tier_h100.json
    python bench/tier.py --smoke --out /tmp/tier.json          # CPU, tiny sizes: the script runs

Random weights (bench/hybrid.py's `build`) in SmolLM2-135M's shapes and in Llama-3.2-1B's
(16 layers, 8 KV heads of 64: a 16-token block is 0.5 MB of K/V), bfloat16.

- `bandwidth`: 128 blocks offloaded from the pool into tier slots and loaded back into other
  blocks, through the engine's own copies; bytes over the time to the last byte (median of 5).
- `repeat`: a prefix (2,048 tokens + 4 of a question; and a 4,096-token document) computed, pushed
  out of a pool of 300 blocks by another long prompt, then asked again with another question:
  that request's wall time with a CPU tier (its blocks copied back, the rest computed a step
  later) against without (all of it computed), median of 7 after a warm-up cycle.
- `overlap`: 32 requests decoding; every 8 steps one more arrives whose 2,048-token prefix is in
  the tier. The decoders' step time in the steps where a load is under way against the steps
  where none is: what a load in flight costs the rest of the batch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench import hybrid  # noqa: E402
from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402

FULL = dict(blocks=128, system=2048, doc=4096, evictor=4600, pool=300, repeats=7,
            decoders=32, decoder_prompt=512, prefixes=8, overlap_new=160)
SMOKE = dict(blocks=8, system=96, doc=128, evictor=150, pool=14, repeats=2,
             decoders=3, decoder_prompt=48, prefixes=3, overlap_new=48)
ONE = SamplingParams(max_tokens=1, ignore_eos=True)
#: the repeat's tier: the document and two evictors' blocks (256 + 2 x 288), so that a tier
#: storing blocks once computed keeps the document as one storing them when evicted does
REPEAT_TIER = 1024
#: EngineConfig.tier_store for every engine here (bench/ab_trees.py --envs compares the two)
TIER_STORE_ENV = "PAGEDLAB_TIER_STORE"


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def dtype(device: str) -> str:
    return "bfloat16" if device == "cuda" else "float32"


def engine(path: str, device: str, blocks: int, tier: int, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=path, device=device, dtype=dtype(device), block_size=16,
                                  num_gpu_blocks=blocks, num_offload_blocks=tier,
                                  max_num_batched_tokens=8192,
                                  tier_store=tier_store(), **kw))


def tier_store() -> str:
    """The engines' EngineConfig.tier_store: TIER_STORE_ENV, else the engine's default."""
    return os.environ.get(TIER_STORE_ENV, "evicted")


def bandwidth(path: str, device: str, sizes: dict) -> dict:
    """The tier's copies of n blocks each way. Their speed is read on the device (CUDA events:
    from the call to the copy's last byte), beside the host's wall time to the same point:
    runs 55-57 saw the host learn of a copy done in 1.6 ms up to 4 ms later, early in a
    process (bench/d2h_probe.py), which is the host's lateness, not the bus's."""
    n = sizes["blocks"]
    eng = engine(path, device, 3 * n, n)
    cache = eng.runtime.cache  # the engine's own copies, driven directly
    cache.kv_cache.normal_()
    walls: dict[str, list[float]] = {"out": [], "in": []}
    on_device: dict[str, list[float]] = {"out": [], "in": []}
    calls: dict[str, list[float]] = {"out": [], "in": []}
    for _ in range(5):
        sync(device)
        mark = _Marks(device)
        t0 = time.perf_counter()
        cache.offload([(b, b) for b in range(n)])
        calls["out"].append(time.perf_counter() - t0)  # the host's part: the call itself
        mark.after(cache.tier.last_copy(n - 1))
        cache.tier.read(n - 1)  # waits for the slot's copy: the last byte on the host
        walls["out"].append(time.perf_counter() - t0)
        on_device["out"].append(mark.seconds())
        sync(device)
        mark = _Marks(device)
        t0 = time.perf_counter()
        cache.load([(s, n + s) for s in range(n)])
        calls["in"].append(time.perf_counter() - t0)
        cache.wait_for_loads([list(range(n, 2 * n))])
        mark.after(None)
        sync(device)
        walls["in"].append(time.perf_counter() - t0)
        on_device["in"].append(mark.seconds())
    same = bool(torch.equal(cache.kv_cache[:, :, :n], cache.kv_cache[:, :, n:2 * n]))
    nbytes = n * cache.tier.slot_bytes
    calls_profile = _call_profile(cache, n, device)
    gather_ms = _gather_ms(cache, n) if device == "cuda" else None
    eng.close()
    timed = on_device if device == "cuda" else walls
    return {"blocks": n, "bytes": nbytes, "slot_bytes": nbytes // n, "same_bytes_back": same,
            "gpu_to_cpu_gb_s": _gb_s(nbytes, timed["out"]),
            "cpu_to_gpu_gb_s": _gb_s(nbytes, timed["in"]),
            "timed_on": "device" if device == "cuda" else "host",
            "host_gb_s": {way: _gb_s(nbytes, t) for way, t in walls.items()},
            "call_ms": {way: round(1e3 * statistics.median(t), 3) for way, t in calls.items()},
            "copy_ms": {way: round(1e3 * statistics.median(t), 3) for way, t in timed.items()},
            "host_wall_ms": {way: [round(1e3 * x, 3) for x in t] for way, t in walls.items()},
            "call_profile": calls_profile, "gather_ms": gather_ms}


def _gb_s(nbytes: int, seconds: list[float]) -> float:
    return round(nbytes / statistics.median(seconds) / 1e9, 1)


class _Marks:
    """A copy's time on the device: an event on the compute stream before its call, and one
    after what the copy's last event marks (the compute stream made to wait for it)."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)
            self.start.record()

    def after(self, event: Any) -> None:
        """`event`: the copy's own last event (None: the compute stream already waits)."""
        if self.cuda:
            if event is not None:
                torch.cuda.current_stream().wait_event(event)
            self.end.record()

    def seconds(self) -> float:
        if not self.cuda:
            return 0.0
        self.end.synchronize()
        return self.start.elapsed_time(self.end) / 1e3


def _gather_ms(cache: Any, n: int, rounds: int = 5) -> float:
    """The offload's gather of n blocks alone, on the device (the median of CUDA events): the
    part of the copy out that is not the bus."""
    from engine.runtime.tier_copies import _gather

    times = []
    for _ in range(rounds + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        _gather(cache.kv_cache, list(range(n)), cache.tier.parts)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return round(statistics.median(times[1:]), 3)


def _call_profile(cache: Any, n: int, device: str, rounds: int = 5) -> dict[str, list[str]]:
    """Where the host's part of each copy goes (`call_ms`: the offload and load calls before
    the bus starts): the calls again under cProfile, their functions by own time a call."""
    import cProfile
    import pstats

    from bench.measure import top_functions

    got = {}
    for way, call in (("out", lambda: cache.offload([(b, b) for b in range(n)])),
                      ("in", lambda: cache.load([(s, n + s) for s in range(n)]))):
        prof = cProfile.Profile()
        for _ in range(rounds):
            sync(device)
            prof.enable()
            call()
            prof.disable()
            cache.wait_for_loads([list(range(n, 2 * n))])
            sync(device)
        got[way] = top_functions(pstats.Stats(prof), per=rounds, top=14)
    return got


def repeat_cycle(path: str, device: str, prefix_len: int, sizes: dict, tier: int) -> dict:
    eng = engine(path, device, sizes["pool"], tier)
    prefix = hybrid._prompts(1, prefix_len, prefix_len, 4)[0]
    evictor = hybrid._prompts(1, sizes["evictor"], sizes["evictor"], 5)[0]
    times, firsts, evicting = [], [], []
    for r in range(sizes["repeats"] + 1):  # the first cycle warms up
        eng.generate([prefix + [7, 8, 9, 10 + r]], ONE)
        sync(device)
        t0 = time.perf_counter()
        eng.generate([evictor[r:] + evictor[:r]], ONE)  # another one each time: evicts the prefix
        sync(device)
        evicting.append(time.perf_counter() - t0)  # a tier storing computed blocks pays here
        t0 = time.perf_counter()
        (out,) = eng.generate([prefix + [11, 12, 13, 14 + r]], ONE)
        sync(device)
        if r:
            times.append(time.perf_counter() - t0)
            firsts.append(out.outputs[0].token_ids[0])
    m = eng.snapshot().metrics
    bus = eng.runtime.cache.tier  # copies over the bus: one per run of consecutive tier slots
    copies = {way: {"copies": n, "mb_per_copy": round(bus.bus_bytes[way] / max(1, n) / 2**20, 2)}
              for way, n in bus.bus_copies.items()}
    eng.close()
    return {"median_ms": round(1e3 * statistics.median(times), 3), "runs_ms":
            [round(1e3 * t, 3) for t in times], "first_tokens": firsts,
            "evictor_median_ms": round(1e3 * statistics.median(evicting[1:]), 3),
            "tier_store": eng.config.tier_store,
            "offload_hit_blocks": m.offload_hit_blocks, "bus_copies": copies}


def repeat_phases(path: str, device: str, sizes: dict) -> dict:
    """The 4,096-token document's repeat from the tier with the engine's host phases timed in
    place, unprofiled (bench/tier_phases.py), beside the host's speed as it began."""
    from bench.host_speed import python_ms
    from bench.tier_phases import repeat_phases as phases
    from bench.tier_phases import repeat_profile

    eng = engine(path, device, sizes["pool"], REPEAT_TIER)
    doc = hybrid._prompts(1, sizes["doc"], sizes["doc"], 4)[0]
    evictor = hybrid._prompts(1, sizes["evictor"], sizes["evictor"], 5)[0]
    loop = python_ms()
    got = phases(eng, doc, evictor, sizes["repeats"], lambda: sync(device), ONE)
    profile = repeat_profile(eng, doc, evictor, sizes["repeats"], lambda: sync(device), ONE)
    eng.close()
    return {"python_ms": loop, "ms": got, "profile": profile}


def repeat(paths: dict[str, str], device: str, sizes: dict) -> dict:
    out = {}
    for label, path, plen in (("smollm2_2052", paths["smollm2"], sizes["system"]),
                              ("llama1b_2052", paths["one_b"], sizes["system"]),
                              ("llama1b_4096_document", paths["one_b"], sizes["doc"])):
        tier = repeat_cycle(path, device, plen, sizes, REPEAT_TIER)
        plain = repeat_cycle(path, device, plen, sizes, 0)
        out[label] = {"tier": tier, "recompute": plain, "same_first_tokens":
                      tier["first_tokens"] == plain["first_tokens"],
                      "recompute_over_tier": round(plain["median_ms"] / tier["median_ms"], 3)}
        print(json.dumps({label: out[label]["recompute_over_tier"]}), flush=True)
    return out


def overlap(path: str, device: str, sizes: dict, probe: Any = None) -> dict:
    """`probe` (bench/tier_profile.py): wraps each step and hears how it went."""
    n, plen, new = sizes["decoders"], sizes["decoder_prompt"], sizes["overlap_new"]
    prefixes = hybrid._prompts(sizes["prefixes"], sizes["system"], sizes["system"], 30)
    per_prefix = -(-sizes["system"] // 16) + 1
    blocks = n * -(-(plen + new) // 16) + per_prefix  # room for one prefix: the rest in the tier
    # the tier holds every prefix and, where it stores blocks once computed, the pool's as well
    eng = engine(path, device, blocks, sizes["prefixes"] * per_prefix + blocks + 64,
                 async_scheduling=True)
    for p in prefixes:  # cached, and pushed into the tier as the decoders take the pool
        eng.generate([p + [1]], ONE)
    for p in hybrid._prompts(n, plen, plen, 31):
        eng.add_request(p, SamplingParams(max_tokens=new, ignore_eos=True))
    quiet, loading, arrivals = [], [], iter(prefixes)
    steps, before = 0, allocator_counts(device)
    while eng.has_pending_work():
        with probe.step(steps) if probe else contextlib.nullcontext():
            t0 = time.perf_counter()
            result = eng.step()
            wall = time.perf_counter() - t0
        steps += 1
        loads = any(e.kind == "load" for e in result.events)
        if result.num_decodes >= n and not result.num_prefills:
            (loading if loads else quiet).append(wall)
        if probe:
            probe.heard(steps - 1, wall, loads, result.num_decodes >= n and not result.num_prefills)
        if steps % 8 == 0 and steps > 16:
            p = next(arrivals, None)
            if p is not None:
                eng.add_request(p + [2, 3], SamplingParams(max_tokens=4, ignore_eos=True))
    hits = eng.snapshot().metrics.offload_hit_blocks
    after = allocator_counts(device)
    eng.close()
    q = statistics.median(quiet) if quiet else None
    ld = statistics.median(loading) if loading else None
    return {"quiet_step_ms": q and round(1e3 * q, 3), "load_step_ms": ld and round(1e3 * ld, 3),
            "steps_with_a_load": len(loading), "offload_hit_blocks": hits,
            "allocator_during_steps": {k: after[k] - before[k] for k in after},
            "tokens_per_s_with_load_over_without": round(q / ld, 3) if q and ld else None}


def allocator_counts(device: str) -> dict[str, int]:
    """The caching allocator's counters that mean a synchronisation or a trip to the driver: a
    failed allocation retried after freeing the cache (which synchronises the device), memory
    taken from and given back to the device, the streams all synchronised."""
    keys = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams")
    stats = torch.cuda.memory_stats() if device == "cuda" else {}
    return {k: int(stats.get(k, 0)) for k in keys}


def overlaps(path: str, device: str, sizes: dict, engines: int) -> dict:
    """`overlap` on `engines` engines made one after another: the medians, and each engine's."""
    runs = [overlap(path, device, sizes) for _ in range(engines)]
    if engines == 1:
        return runs[0]
    keys = ("quiet_step_ms", "load_step_ms", "tokens_per_s_with_load_over_without")
    return {**{k: statistics.median(r[k] for r in runs) for k in keys}, "engines": runs}


def profile(path: str, device: str, sizes: dict) -> dict:
    """Where the time of one repeat goes (with the tier and without): the host's functions
    (cProfile) and the device's kernels and copies (torch.profiler)."""
    import cProfile
    import io
    import pstats

    out = {}
    for tier in (REPEAT_TIER, 0):
        eng = engine(path, device, sizes["pool"], tier)
        prefix = hybrid._prompts(1, sizes["system"], sizes["system"], 4)[0]
        evictor = hybrid._prompts(1, sizes["evictor"], sizes["evictor"], 5)[0]
        for r in range(3):
            eng.generate([prefix + [7, 8, 9, 10 + r]], ONE)
            eng.generate([evictor[r:] + evictor[:r]], ONE)
            if r < 2:
                eng.generate([prefix + [11, 12, 13, 14 + r]], ONE)
        sync(device)
        prof, host = cProfile.Profile(), time.perf_counter()
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as tprof:
            prof.enable()
            eng.generate([prefix + [11, 12, 13, 20]], ONE)
            prof.disable()
            sync(device)
        wall = time.perf_counter() - host
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(20)
        table = tprof.key_averages().table(sort_by="self_cuda_time_total" if device == "cuda"
                                           else "self_cpu_time_total", row_limit=15)
        out["tier" if tier else "recompute"] = {"wall_ms": round(1e3 * wall, 2),
                                                "host": text.getvalue().splitlines()[:35],
                                                "device": table.splitlines()}
        eng.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--only", nargs="+", default=["bandwidth", "repeat", "overlap"])
    ap.add_argument("--engines", type=int, default=1,
                    help="overlap: that many engines one after another, medians over them (the "
                         "load step has settled differently from one engine to the next)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sizes = SMOKE if args.smoke else FULL
    if args.smoke:
        hybrid.SIZES.update(hybrid.SMOKE)
    folder = Path(tempfile.mkdtemp(prefix="tier-"))
    one_b = hybrid.ONE_B if not args.smoke else {**hybrid.SHAPE, "num_hidden_layers": 2}
    built: dict[str, str] = {}

    def path(name: str) -> str:  # built when a stage first needs it (a 1B model saves slowly)
        if name not in built:
            built[name] = hybrid.build(folder / name, False, one_b if name == "one_b" else None)
        return built[name]

    result: dict = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                    "torch": torch.__version__, "smoke": args.smoke, "sizes": sizes}
    for stage in args.only:
        t0 = time.perf_counter()
        if stage == "bandwidth":
            result["bandwidth"] = bandwidth(path("one_b"), args.device, sizes)
            print(json.dumps(result["bandwidth"]), flush=True)
        elif stage == "repeat":
            result["repeat"] = repeat({k: path(k) for k in ("smollm2", "one_b")}, args.device, sizes)
        elif stage == "profile":
            result["profile"] = profile(path("smollm2"), args.device, sizes)
        elif stage == "overlap_profile":
            from bench.tier_profile import profiled_overlap
            result["overlap_profile"] = profiled_overlap(path("one_b"), args.device, sizes,
                                                         Path(args.out).parent)
        elif stage == "repeat_phases":
            result["repeat_phases"] = repeat_phases(path("one_b"), args.device, sizes)
            print(json.dumps(result["repeat_phases"]), flush=True)
        elif stage == "repeat_timeline":
            from bench.tier_profile import repeat_timeline
            result["repeat_timeline"] = repeat_timeline(path("one_b"), args.device, sizes,
                                                        Path(args.out).parent)
        elif stage == "overlap":
            result["overlap"] = overlaps(path("one_b"), args.device, sizes, args.engines)
            print(json.dumps(result["overlap"]), flush=True)
        result.setdefault("stage_seconds", {})[stage] = round(time.perf_counter() - t0, 1)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
