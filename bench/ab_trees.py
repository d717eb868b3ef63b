"""Two versions of the code, by turns on one machine: `bench/mem_gpu.py --only <parts>` run from
each tree in turn, several rounds, so that a change to a host-bound row is judged against the
spread of that row from one engine to the next rather than against another lease's run.

    git archive <commit> engine paged_kernels bench pyproject.toml | tar -x -C ab_old   # the "before"
    cp bench/*.py ab_old/bench/                    # both sides measured by the same bench
    python bench/ab_trees.py --trees ab_old . --rounds 3 --only hybrid tier --out "$OUT/ab.json"
    python bench/ab_trees.py --trees ab_old . --rounds 6 --bench tier --only overlap --out "$OUT/ab.json"
    python bench/ab_trees.py --trees . . --envs - OMP_NUM_THREADS=1 --only tier --out "$OUT/ab.json"
    python bench/ab_trees.py --trees ab_old . --warm-up --budget 500 --rounds 9 --only hybrid tier \
        --out "$OUT/ab.json"

A turn of `--only hybrid tier roofline` took 130 s on an H200 (run 9), the first one on a new
machine more (it compiles): `--warm-up` and `--budget` fit a ten-minute call.

Writes the rows of every turn (bench/mem_table.py's measures) and each tree's turns side by
side; each turn is a fresh process (its own engines, its own heap).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def rows(result: dict) -> dict:
    """The host-bound rows of a mem_gpu.json: rejected drafts' ratios, the hybrid's ratios and
    its prefill and decode seconds, the tier's document repeat and load step, the 1.2B step
    over its roofline."""
    out: dict = {}
    for length, got in result.get("hybrid", {}).items():
        if isinstance(got, dict) and "hybrid" in got:
            h, f = got["hybrid"], got["full"]
            out[f"hybrid_{length}"] = round(h["tokens_per_s"] / f["tokens_per_s"], 3)
            out[f"prefill_{length}_s"] = [h["prefill_steps_s"], f["prefill_steps_s"]]
            out[f"decode_{length}_s"] = [h["decode_steps_s"], f["decode_steps_s"]]
    for model, got in result.get("rejects", {}).items():
        if isinstance(got, dict) and "drafts_over_none" in got:
            out[f"rejects_{model}"] = got["drafts_over_none"]
    tier = result.get("tier", result)  # mem_gpu's part, or bench/tier.py's whole result
    doc = tier.get("repeat_document")
    if doc:
        out["tier_document"] = doc["recompute_over_tier"]
        out["tier_ms"] = [doc["tier"]["median_ms"], doc["recompute"]["median_ms"]]
        if "evictor_median_ms" in doc["tier"]:  # the request that evicts it (tier_store)
            out["evictor_ms"] = doc["tier"]["evictor_median_ms"]
    if tier.get("overlap"):
        o = tier["overlap"]
        out["load_step"] = o["tokens_per_s_with_load_over_without"]
        out["load_quiet_ms"] = [o["load_step_ms"], o["quiet_step_ms"]]
        if "engines" in o:  # bench/tier.py --engines N: each engine's too
            out["load_steps"] = [e["tokens_per_s_with_load_over_without"] for e in o["engines"]]
    if tier.get("bandwidth"):
        out["copies_gb_s"] = [tier["bandwidth"]["gpu_to_cpu_gb_s"], tier["bandwidth"]["cpu_to_gpu_gb_s"]]
        if tier["bandwidth"].get("gather_ms") is not None:
            out["gather_ms"] = tier["bandwidth"]["gather_ms"]
    for seqs, got in result.get("roofline", {}).items():
        if isinstance(got, dict) and "async_over_roofline" in got:
            out[f"roofline_{seqs}"] = got["async_over_roofline"]
            out[f"host_ms_{seqs}"] = got["host_ms_per_step"]
    out["gc_pauses"] = result.get("gc_pauses")
    out["python_ms"] = result.get("python_ms")  # the host's speed as each part began
    out["busy_cpus"] = result.get("busy_cpus")
    return out


def turn(tree: str, bench: str, parts: list[str], timeout: int, smoke: bool, env: str = "-",
         extra: str = "") -> dict:
    folder = tempfile.mkdtemp(prefix="ab-")
    out = folder if bench == "mem_gpu" else os.path.join(folder, "mem_gpu.json")
    cmd = [sys.executable, os.path.join(tree, "bench", f"{bench}.py"), "--only", *parts, "--out", out,
           *(["--smoke"] if smoke else []), *shlex.split(extra)]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **_env(env)})
    except subprocess.TimeoutExpired:
        return {"error": f"no result in {timeout} s"}
    path = Path(folder) / "mem_gpu.json"
    if not path.exists():
        return {"error": (done.stdout + done.stderr)[-2000:]}
    got = rows(json.loads(path.read_text()))
    got["seconds"] = round(time.perf_counter() - t0, 1)
    return got


def _env(spec: str) -> dict[str, str]:
    """"NAME=VALUE,NAME=VALUE" as a dict; "-" for none."""
    return {} if spec == "-" else dict(kv.split("=", 1) for kv in spec.split(","))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", required=True, help="the before and after folders")
    ap.add_argument("--envs", nargs="+", default=None,
                    help="each tree's extra environment, NAME=VALUE[,NAME=VALUE] or - (one per tree: "
                         "the same tree twice with two environments compares settings)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bench", choices=["mem_gpu", "tier"], default="mem_gpu",
                    help="which bench each turn runs (tier: bench/tier.py's stages, e.g. overlap)")
    ap.add_argument("--only", nargs="+", default=["hybrid", "tier"])
    ap.add_argument("--timeout", type=int, default=150, help="seconds a turn may take")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for all the turns: a round that would end past it (at the "
                         "slowest turn's pace so far) is not started, so a device call ends "
                         "with whole rounds written rather than killed mid-turn")
    ap.add_argument("--warm-up", action="store_true",
                    help="first an unrecorded turn of every tree: on a new machine the first "
                         "process compiles every kernel (run 9's first turn ran past 170 s)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="mem_gpu's tiny sizes (a CPU check)")
    ap.add_argument("--extra", default="", help="more arguments for every turn's bench, as one "
                    "string: --extra='--engines 3'")
    args = ap.parse_args()
    envs = args.envs or ["-"] * len(args.trees)
    if len(envs) != len(args.trees):
        ap.error("--envs needs one entry per tree")
    sides = [(tree, env, tree if env == "-" else f"{tree} {env}")
             for tree, env in zip(args.trees, envs, strict=True)]
    start, slowest = time.perf_counter(), 0.0
    if args.warm_up:
        for tree, env, name in sides:
            t0 = time.perf_counter()
            turn(os.path.abspath(tree), args.bench, args.only, args.timeout, args.smoke, env, args.extra)
            print(json.dumps({"warm_up": name, "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    turns: list[dict] = []
    for r in range(args.rounds):
        left = None if args.budget is None else args.budget - (time.perf_counter() - start)
        if left is not None and left < slowest * len(sides):  # whole rounds only
            print(json.dumps({"stopped": f"before round {r}: {left:.0f} s left, a turn takes "
                                         f"{slowest:.0f}"}), flush=True)
            break
        for tree, env, name in sides:
            t0 = time.perf_counter()
            got = {"round": r, "tree": name, **turn(os.path.abspath(tree), args.bench, args.only,
                                                          args.timeout, args.smoke, env, args.extra)}
            slowest = max(slowest, time.perf_counter() - t0)
            turns.append(got)
            print(json.dumps({k: v for k, v in got.items() if k != "gc_pauses"}), flush=True)
            Path(args.out).write_text(json.dumps({"turns": turns}, indent=1))
    _write(args.out, turns, sides)


def _write(out: str, turns: list[dict], sides: list[tuple[str, str, str]]) -> None:
    """Every turn, and each side's rows with their medians."""
    side = {}
    for _, _, name in sides:
        mine = [t for t in turns if t["tree"] == name and "error" not in t]
        keys = ("rejects_smollm2", "rejects_llama1b", "hybrid_1024", "hybrid_4096", "tier_document",
                "load_step", "roofline_64", "roofline_256")
        side[name] = {k: [t[k] for t in mine] for k in keys if mine and k in mine[0]}
        side[name]["medians"] = {k: statistics.median(v) for k, v in side[name].items() if v}
    Path(out).write_text(json.dumps({"turns": turns, "by_tree": side}, indent=1))
    print(json.dumps(side, indent=1))


if __name__ == "__main__":
    main()
