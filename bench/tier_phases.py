"""Where the document's repeat from the tier spends the host's time, unprofiled: the engine's
phases timed in place (perf_counter around each, summed over the repeat's steps), medians over
the repeats. Nested phases are each timed whole (`schedule` holds `tier_match`, `tier_load`,
which holds `take_blocks`). `device_wait`: the end of the request to its last kernel (the
bench's sync). Runs dry too (model None), for the bookkeeping's share on any CPU.

    python bench/tier.py --device cuda --only repeat_phases --out "$OUT/tier_phases.json"
    python bench/tier_phases.py                     # dry, on this CPU
    python bench/tier_phases.py --ab 5 --out bench/results/dry_tier_store_ab.json
                          # dry, tier_store "evicted" and "computed" by turns, a process a turn
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import LLMEngine, step_run  # noqa: E402
from engine.core.block_writer import BlockWriter  # noqa: E402
from engine.core.in_flight import InFlight  # noqa: E402
from engine.core.scheduler import Scheduler  # noqa: E402
from engine.core.tier_loads import TierLoads  # noqa: E402
from engine.runtime import tier_copies  # noqa: E402

#: phase -> (owner, attribute): what is timed in place
PHASES: dict[str, tuple[Any, str]] = {
    "add_request": (LLMEngine, "add_request"),
    "schedule": (Scheduler, "schedule"),
    "tier_match": (TierLoads, "match"),
    "tier_load": (TierLoads, "load"),
    "take_blocks": (BlockWriter, "take_blocks"),
    "copies": (step_run, "move_blocks"),
    "pick": (step_run, "pick"),
    "land": (InFlight, "after_launch"),
    # the runtime's three tier calls, and the index tensors they send (host lists to the device)
    "fetch_ahead": (tier_copies.TierCopies, "fetch_ahead"),
    "offload_call": (tier_copies.TierCopies, "offload"),
    "load_call": (tier_copies.TierCopies, "load"),
    "index_to_device": (tier_copies, "to_device"),
}


@contextlib.contextmanager
def timed_phases(extra: dict[str, tuple[Any, str]] | None = None
                 ) -> Iterator[dict[str, float]]:
    """Every phase's seconds while inside (the dict fills as the engine runs)."""
    spent: dict[str, float] = defaultdict(float)
    originals = []
    for name, (owner, attr) in {**PHASES, **(extra or {})}.items():
        fn = getattr(owner, attr)
        originals.append((owner, attr, fn))
        setattr(owner, attr, _timer(fn, name, spent))
    try:
        yield spent
    finally:
        for owner, attr, fn in originals:
            setattr(owner, attr, fn)


def _timer(fn: Callable, name: str, spent: dict[str, float]) -> Callable:
    def timed(*args: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            spent[name] += time.perf_counter() - t0
    return timed


def repeat_phases(eng: LLMEngine, prefix: list[int], evictor: list[int], repeats: int,
                  sync: Callable[[], None], params: Any) -> dict:
    """The repeat of `prefix` after `evictor` pushed it into the tier, `repeats` times after a
    warm-up cycle: its wall time and each phase's, in ms (medians), and their sum's share."""
    rows: list[dict[str, float]] = []
    runtime_execute = {"execute": (type(eng.runtime), "execute")}
    for r in range(repeats + 1):
        eng.generate([prefix + [7, 8, 9, 10 + r]], params)
        sync()
        t0 = time.perf_counter()
        eng.generate([evictor[r:] + evictor[:r]], params)
        sync()
        evictor_wall = time.perf_counter() - t0  # where storing computed blocks pays
        with timed_phases(runtime_execute) as spent:
            t0 = time.perf_counter()
            eng.generate([prefix + [11, 12, 13, 14 + r]], params)
            t1 = time.perf_counter()
            sync()
            t2 = time.perf_counter()
        if r:
            rows.append({**spent, "device_wait": t2 - t1, "wall": t2 - t0,
                         "evictor_wall": evictor_wall})
    keys = sorted({k for row in rows for k in row})
    return {k: round(1e3 * statistics.median(row.get(k, 0.0) for row in rows), 3) for k in keys}


def repeat_profile(eng: LLMEngine, prefix: list[int], evictor: list[int], repeats: int,
                   sync: Callable[[], None], params: Any, top: int = 40) -> list[dict]:
    """The same repeats under cProfile: the functions (C calls into torch included) with the
    most time of their own, ms a repeat. cProfile slows the Python around them; a C call's own
    time (a copy's launch, an event's record) is what it is, so this names the costly calls of
    the phases `repeat_phases` times unprofiled."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    for r in range(repeats + 1):
        eng.generate([prefix + [7, 8, 9, 10 + r]], params)
        eng.generate([evictor[r:] + evictor[:r]], params)
        sync()
        if r:
            prof.enable()
        eng.generate([prefix + [11, 12, 13, 14 + r]], params)
        sync()
        prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, prim, own s, cum s, callers)
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [{"fn": f"{os.path.basename(f)}:{line}:{name}", "calls": round(c / repeats, 1),
             "own_ms": round(1e3 * own / repeats, 3), "cum_ms": round(1e3 * cum / repeats, 3)}
            for (f, line, name), (c, _, own, cum, _) in rows]


def by_turns(rounds: int, out: str) -> None:
    """`rounds` rounds of the dry repeat, each tier_store a process of its own in turn."""
    import subprocess

    from bench import tier
    from bench.host_facts import host_cpus
    turns = []
    for r in range(rounds):
        for store in ("evicted", "computed"):
            run = subprocess.run([sys.executable, __file__], capture_output=True, text=True,
                                 check=True, env={**os.environ, tier.TIER_STORE_ENV: store})
            turns.append({"round": r, "tier_store": store, **json.loads(run.stdout)})
    medians = {store: {k: round(statistics.median(t[k] for t in turns
                                                  if t["tier_store"] == store), 3)
                       for k in turns[0] if k not in ("round", "tier_store")}
               for store in ("evicted", "computed")}
    with open(out, "w") as f:
        json.dump({"host": host_cpus(), "medians": medians, "turns": turns}, f, indent=1)
    print(json.dumps(medians, indent=1))


def main() -> None:
    if "--ab" in sys.argv:
        return by_turns(int(sys.argv[sys.argv.index("--ab") + 1]),
                        sys.argv[sys.argv.index("--out") + 1])
    from bench import hybrid, tier
    from bench.dry_bookkeeping import FULL, _ids
    from engine import EngineConfig, SamplingParams
    from engine.runtime.collector import settle_heap
    eng = LLMEngine(EngineConfig(model=None, block_size=16, num_gpu_blocks=FULL["pool"],
                                 num_offload_blocks=tier.REPEAT_TIER, max_num_batched_tokens=8192,
                                 tier_store=tier.tier_store()))
    doc = _ids(hybrid._prompts(1, FULL["doc"], FULL["doc"], 4)[0])
    evictor = _ids(hybrid._prompts(1, FULL["evictor"], FULL["evictor"], 5)[0])
    settle_heap()
    got = repeat_phases(eng, doc, evictor, 9, lambda: None,
                        SamplingParams(max_tokens=1, ignore_eos=True))
    print(json.dumps(got, indent=1))


if __name__ == "__main__":
    main()
