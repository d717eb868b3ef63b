"""Sentences of the README's issue 44 paragraph that read runs made by turns, beside a timed loop
(bench/host_speed.py, bench/ab_trees.py) or a part run again, from their committed results. Each
returns "" when its result is not there. bench/report.py puts them after the table's caption."""

from __future__ import annotations

import json
import os
import re
import statistics

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


#: bench/host_speed.py's loop between its two values (~1.6-2.0 ms fast, 3.4-4.5 ms slow)
SLOW_LOOP_MS = 2.7

def _load(name: str) -> dict | None:
    path = os.path.join(RESULTS, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def run_19() -> str:
    """Run 19: neither the GPU's interrupts nor stolen time the guest can see."""
    got = _load("host_speed_run19_h200.json")
    if got is None:
        return ""
    engines = [e for p in got["processes"] for e in p["engines"]]
    irqs = sum(sum(e["gpu_interrupts_during_steps"].values()) for e in engines)
    steal = sum(sum(e["steal_ticks_during_steps"].values()) for e in engines)
    loops = [x for e in engines for x in (e["python_ms"], e["python_ms_after"])]
    moved = max(engines, key=lambda e: max(e["python_ms"], e["python_ms_after"])
                / min(e["python_ms"], e["python_ms_after"]))
    return (f" In {len(engines)} more engines (`host_speed_run19_h200.json`) the GPU raised "
            f"{irqs} interrupts during the steps and the guest counted {steal} stolen ticks in "
            f"all; the thread pinned to one CPU was fast or slow alike, and the loop took "
            f"{min(loops):.2f}-{max(loops):.2f} ms, once {moved['python_ms']:.2f} ms before an "
            f"engine's steps and {moved['python_ms_after']:.2f} ms after them: the host's "
            "speed is decided outside the machine we are lent, so these rows are read beside "
            "the loop that was timed with them.")


def run_22() -> str:
    """Run 22: the tier's load over the bus ahead of the offloads, by turns with the code before."""
    got = _load("ab_tier_run22_h200.json")
    if got is None:
        return ""
    turns = {tree: [t for t in got["turns"] if t["tree"] == tree] for tree in ("ab_old", ".")}

    def ms(tree: str) -> list[float]:
        return [t["tier_ms"][0] for t in turns[tree]]

    def ratio(tree: str) -> float:
        return statistics.median(t["tier_document"] for t in turns[tree])

    before, after = ms("ab_old"), ms(".")
    return (f" Since then the load of a prefix from the tier starts over the bus before the "
            f"offloads of the blocks it evicts (run 22, `ab_tier_run22_h200.json`: {len(after)} "
            f"turns each, alternating with the code before it): the 4,096-token document came "
            f"back in "
            f"{min(after):.2f}-{max(after):.2f} ms against {min(before):.2f}-{max(before):.2f} ms, "
            f"{ratio('.'):.2f}x recomputing against {ratio('ab_old'):.2f}x (medians).")


def run_23() -> str:
    """Run 23: the load's bus copy starts when the bookkeeping has chosen its slots, by turns
    with run 22's code (two calls; a tree's first turn on a fresh machine compiles, so it is
    left out where it came before any warm-up)."""
    calls = [_load("ab_tier_run23_h200.json"), _load("ab_tier_run23b_h200.json")]
    if None in calls:
        return ""
    turns = [t for got in calls for t in got["turns"]]
    cold = calls[1]["turns"][0]  # the second call ran no warm-up: its first turn compiled
    rounds = [(a, b) for a, b in zip(turns[::2], turns[1::2], strict=True) if a is not cold]
    won = sum(b["tier_ms"][0] < a["tier_ms"][0] for a, b in rounds)
    before = [a["tier_ms"][0] for a, _ in rounds]
    after = [b["tier_ms"][0] for _, b in rounds]
    return (f" In run 23 the copy over the bus starts as soon as the bookkeeping has chosen the "
            f"slots, before it allocates and evicts for them (`ab_tier_run23_h200.json`, "
            f"`ab_tier_run23b_h200.json`: {len(rounds)} rounds by turns with run 22's code): the "
            f"document came back in {statistics.median(after):.2f} ms against "
            f"{statistics.median(before):.2f} (medians; shorter in {won} of {len(rounds)} rounds), "
            f"{statistics.median(b['tier_document'] for _, b in rounds):.2f}x recomputing against "
            f"{statistics.median(a['tier_document'] for a, _ in rounds):.2f}x.")


def run_24() -> str:
    """Run 24: a prompt alone computes its rest in the step its blocks come back from the tier,
    by turns with run 23's code (one call, no warm-up: the first round compiled both trees)."""
    got = _load("ab_tier_run24_h200.json")
    if got is None:
        return ""
    turns = got["turns"]
    rounds = list(zip(turns[::2], turns[1::2], strict=True))
    longer = sum(b["tier_ms"][0] > a["tier_ms"][0] for a, b in rounds)

    def med(side: int, key: str, i: int | None = None) -> float:
        return statistics.median(r[side][key] if i is None else r[side][key][i] for r in rounds)

    loads = [t["load_step"] for t in turns]
    after, before = med(1, "tier_ms", 0), med(0, "tier_ms", 0)
    ratios = med(1, "tier_document"), med(0, "tier_document")
    return (f" In run 24 a prompt that runs alone computes its rest in the step its blocks come "
            f"back (`ab_tier_run24_h200.json`: {len(rounds)} rounds by turns with run 23's code) "
            f"on a lease whose host was fast (both trees over a millisecond quicker than run 23's "
            f"turns): the document came back in {after:.2f} ms against {before:.2f} (medians; "
            f"longer in {longer} of {len(rounds)} rounds), {ratios[0]:.2f}x recomputing against "
            f"{ratios[1]:.2f}x, and the others' tokens/s in a load step "
            f"{min(loads):.2f}-{max(loads):.2f} in every turn of both.")


def run_26() -> str:
    """Run 26: the hybrid with the collector on and off (PAGEDLAB_BENCH_HEAP=off), by turns on
    the same code, each round a turn of each."""
    got = _load("ab_gc_run26_h200.json")
    if got is None:
        return ""
    on, off = got["turns"][::2], got["turns"][1::2]

    def med(turns: list, key: str) -> float:
        return statistics.median(t[key] for t in turns)

    saved = [a["prefill_4096_s"][0] - b["prefill_4096_s"][0] for a, b in zip(on, off, strict=True)]
    still = [b["prefill_4096_s"][0] / b["prefill_4096_s"][1] for b in off]
    return (f" In run 26 the hybrid ran with the collector on and off by turns, the same code "
            f"(`ab_gc_run26_h200.json`: {len(on)} rounds): at 4,096 tokens "
            f"{med(off, 'hybrid_4096'):.2f}x with it off against {med(on, 'hybrid_4096'):.2f}x "
            f"(medians), the hybrid's prefill {min(saved):.2f}-{max(saved):.2f} s shorter, and "
            f"still {min(still):.1f}-{max(still):.1f}x the full model's: the collector is part of "
            "what the hybrid loses at 4,096, not all of it.")


def run_27_28() -> str:
    """Runs 27-28: the hybrid's 4,096 row over its goal in one run, and why; busy CPUs beside
    the turns."""
    one, got = _load("mem_h200_run27.json"), _load("ab_spin_run28_h200.json")
    if one is None or got is None:
        return ""
    h = one["hybrid"]["4096"]
    hybrid = [t["prefill_4096_s"][0] for t in got["turns"]]
    full = [t["prefill_4096_s"][1] for t in got["turns"]]
    middle = (min(full) + max(full)) / 2  # the full engine's two speeds, either side of it
    fast, slow = [v for v in full if v < middle], [v for v in full if v >= middle]
    spin = [t for t in got["turns"] if t.get("busy_cpus")]
    started_slow = sum(ms > SLOW_LOOP_MS for t in spin for ms in t["python_ms"].values())
    parts = sum(len(t["python_ms"]) for t in spin)
    return (f" Run 27 (`mem_h200_run27.json`) read the hybrid at 4,096 "
            f"{h['hybrid_over_full']:.3f}x, over its goal, because its full model's engine ran at "
            f"the slow speed (prefill steps {h['full']['prefill_steps_s']:.2f} s against the "
            f"hybrid's {h['hybrid']['prefill_steps_s']:.2f}). By turns in run 28 "
            f"(`ab_spin_run28_h200.json`) the hybrid's prefill took {min(hybrid):.2f}-"
            f"{max(hybrid):.2f} s in every turn and the full model's {min(fast):.2f}-"
            f"{max(fast):.2f} or {min(slow):.2f}-{max(slow):.2f} s, so that row reads one of two "
            f"values by the full engine's draw; two busy CPUs beside the run did not hold the "
            f"fast speed ({started_slow} of the {parts} parts they ran beside started slow).")


def run_49() -> str:
    """Run 49: the hybrid part once, after the decode attention's split rule for grids of fewer
    programs than SMs (runs 48-49), beside run 42's decode steps."""
    got, before = _load("mem_h200_run49_hybrid.json"), _load("mem_h200_run42.json")
    if got is None or before is None:
        return ""
    now, then = got["hybrid"], before["hybrid"]

    def decode(run: dict, side: str) -> float:
        return run["4096"][side]["decode_steps_s"]

    return (f" In run 49 (`mem_h200_run49_hybrid.json`), after the decode attention's split rule "
            f"for grids of fewer programs than SMs (runs 48-49), the hybrid part ran once: at "
            f"4,096 tokens {now['4096']['hybrid_over_full']:.3f}x by turns (ratio of medians "
            f"{now['4096']['ratio_of_medians']:.3f}), at 1,024 "
            f"{now['1024']['hybrid_over_full']:.3f}x. The full model's decode steps took "
            f"{decode(now, 'full'):.2f} s against run 42's {decode(then, 'full'):.2f} (its 32 "
            f"sequences of 3 KV heads are 96 programs, now split 8 ways), the hybrid's "
            f"{decode(now, 'hybrid'):.2f} against {decode(then, 'hybrid'):.2f}: a faster baseline, "
            "so the row moved away from its goal.")


def host_speed_at_parts(run: dict) -> str:
    """A run's host speed as each part began (its fixed loop), slow or fast."""
    speed = {k: v for k, v in run.get("python_ms", {}).items() if k in
             ("rejects", "hybrid", "tier", "roofline")}
    if not speed:
        return ""
    fast = [k for k, ms in speed.items() if ms <= SLOW_LOOP_MS]
    slow = [k for k in speed if k not in fast]
    said = "; ".join(f"{k} {speed[k]:.2f} ms" for k in speed)
    if not slow or not fast:
        which = f"every one at the {'fast' if fast else 'slow'} speed"
    else:
        which = f"{', '.join(slow)} at the slow speed, {', '.join(fast)} at the fast one"
    return (f" In that run the host's loop (`bench/host_speed.py`) took {said} as the parts "
            f"began: {which}.")


def copies_on_device(name: str) -> str:
    """Run 58: the tier part again, its copies timed on the device beside the host's wall."""
    got = _load(name)
    if got is None:
        return ""
    b = got["tier"]["bandwidth"]
    return (" Its copies row is the host's wall time to the last byte; run 58 (`" + name
            + f"`, the tier part alone) timed the same copies on the device: {b['gpu_to_cpu_gb_s']}"
            f" / {b['cpu_to_gpu_gb_s']} GB/s GPU → CPU / CPU → GPU, where the host saw the last "
            f"byte at {b['host_gb_s']['out']} / {b['host_gb_s']['in']} GB/s (the host learns of "
            "a copy done late, early in a process: `bench/d2h_probe.py`, run 57).")


def run_59() -> str:
    """Run 59: the tier's document by turns on a fast host, storing computed blocks or not."""
    name = "ab_tier_store_run59.json"
    got = _load(name)
    if got is None:
        return ""
    turns = got["turns"]

    def side(computed: bool) -> str:
        got = [t for t in turns if ("TIER_STORE=computed" in t["tree"]) == computed]
        return (" / ".join(f"{t['tier_ms'][0]:.2f}" for t in got) + " ms, "
                + " / ".join(f"{t['tier_document']:.2f}x" for t in got))

    loops = [t["python_ms"]["tier"] for t in turns]
    return (f" By turns on a fast host (run 59, `{name}`, the loop at {min(loops):.2f}-"
            f"{max(loops):.2f} ms), the document came back in {side(True)} recomputing with "
            f"`tier_store=\"computed\"`, against {side(False)} with the default: the 4x row "
            "is met there, not on the slower hosts of runs 55-58.")


def runs_63_64() -> str:
    """Runs 63-65: async decode's fixed host costs cut (the fed tokens gathered in the graph, the
    picks' pinned buffers reused), by turns with the code before it and in a full run."""
    ab, full = _load("ab_run63.json"), _load("mem_h100_run64.json")
    if ab is None or full is None:
        return ""
    trees = ab["by_tree"]

    def both(row: str, unit: str = "") -> str:
        return (" / ".join(f"{v:.3f}{unit}" for v in trees["."][row]) + " against "
                + " / ".join(f"{v:.3f}{unit}" for v in trees["ab_old"][row]))

    roof = full["roofline"]
    at_1024 = trees["."]["hybrid_1024"] + trees["ab_old"]["hybrid_1024"]
    met = " (met in every turn of both)" if min(at_1024) >= 1.0 else ""
    hybrid = full["hybrid"]
    with open(os.path.join(RESULTS, "gpu_tests_run65.log")) as f:
        passed = re.findall(r"^(\d+) passed", f.read(), re.M)[-1]
    return (" Since run 56 the fed tokens of async scheduling are gathered inside the decode graph "
            "and the picks come back through reused pinned buffers. By turns with the code before "
            f"it on a fast host (run 63, `ab_run63.json`, two rounds): hybrid / full {both('hybrid_1024')} "
            f"at 1,024 tokens{met}, {both('hybrid_4096')} at 4,096; the 1.2B step "
            f"{both('roofline_64', 'x')} its roofline at 64 sequences, {both('roofline_256', 'x')} at "
            "256. In a full run on a host as slow as run 56's roofline part (run 64, "
            f"`mem_h100_run64.json`) the 256-sequence step took {roof['256']['async_step_ms']} ms, "
            f"{roof['256']['async_over_roofline']}x its roofline (its graph "
            f"{roof['256']['graph_over_roofline']}x), and the hybrid rows read "
            f"{hybrid['1024']['hybrid_over_full']}x and {hybrid['4096']['hybrid_over_full']}x; its GPU"
            f" tests ran out of their time with none failed, and the {passed} of the changed "
            "paths passed on their own (run 65, `gpu_tests_run65.log`).")


def runs_66_69() -> str:
    """Runs 66-69: where a step's time goes on a fast host, the decode graph timed mid-run, the
    hybrid's prefill bookkeeping cut, and the rows again."""
    gaps, r68 = _load("replay_gaps_run67c.json"), _load("mem_h100_run68.json")
    t69, r69 = _load("timeline_run69.json"), _load("mem_h100_run69_hybrid.json")
    if None in (gaps, r68, t69, r69):
        return ""
    with open(os.path.join(RESULTS, "gpu_tests_run68.log")) as f:
        passed = re.findall(r"^(\d+) passed", f.read(), re.M)[-1]
    g256, roof = gaps["256"], r68["roofline"]
    pre = t69["prefill"]["4096"]

    def step(model: str) -> str:
        return f"{pre[model]['second_run']['median_ms']['wall_ms']:.1f}"

    def hyb(run: dict, length: str) -> str:
        return f"{run['hybrid'][length]['hybrid_over_full']:.3f}"

    return (" Run 67 (`replay_gaps_run67c.json`) timed the 256-sequence graph inside the engine's "
            f"loop at {g256['in_loop']['replay_ms']:.2f} ms a replay, and alone on a steady step's "
            f"inputs at {min(g256['alone_mid_run_ms']):.2f}-{max(g256['alone_mid_run_ms']):.2f} ms, "
            f"where replayed on the inputs a run ended with it took {g256['alone_ms']:.2f} ms: the "
            "graph figures above and before were read there, and `bench/device_step.py` now probes "
            "mid-run. Run 68 (`mem_h100_run68.json`, a fast host; the "
            f"{passed} GPU tests of the changed paths passed, `gpu_tests_run68.log`): the 1.2B step "
            f"{roof['64']['async_over_roofline']}x its roofline at 64 sequences (its graph "
            f"{roof['64']['graph_over_roofline']}x) and {roof['256']['async_over_roofline']}x at 256 "
            f"(its graph {roof['256']['graph_over_roofline']}x): both steps are their graphs'. "
            "Run 69 (`timeline_run69.json`, `mem_h100_run69_hybrid.json`; a sliding group's "
            "prefill tables now built from each row's window, the engine's notes finding their "
            "events at C speed) timed the hybrid's prefill steps at 4,096 tokens, 32 prompts of "
            f"16 new tokens, at {step('hybrid')} ms against the full model's {step('full')} (in "
            "the hybrid part's "
            f"own run, of 256 new tokens a prompt, its prefill steps took "
            f"{r69['hybrid']['4096']['hybrid']['prefill_steps_s']:.2f} s against "
            f"{r69['hybrid']['4096']['full']['prefill_steps_s']:.2f}, as on hosts as fast "
            "before); hybrid / full "
            f"{hyb(r69, '1024')} at 1,024 tokens and "
            f"{hyb(r69, '4096')} at 4,096, where the decode graphs mid-run are "
            f"{r69['hybrid']['4096']['hybrid']['graph_gpu_ms']:.2f} against "
            f"{r69['hybrid']['4096']['full']['graph_gpu_ms']:.2f} ms.")

