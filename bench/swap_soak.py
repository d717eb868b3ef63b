"""A soak of issue 36's workload on the real default model: many randomized runs of the classroom
(30 students, one shared system prompt, greedy answers of 8 tokens, requests arriving a few before
each step into a pool that must preempt), every answer compared with the same request run alone,
in float32 on the CPU. Before the fix, 5 of 25 such runs gave a wrong answer.

Each run draws its arrival order and batch sizes, the block size (8 or 16), the pool (16-22
blocks of 8 or 8-11 of 16) and the swap space (6-10 blocks of 8 or 3-5 of 16); the alone answers
are computed once per block size.
The engine tracks its slots' content (EngineConfig.track_kv_content) and checks it after every
step. Writes bench/results/swap_soak.json (with --out) and prints a line per 50 runs.

    python -m bench.swap_soak --runs 1000 --out bench/results/swap_soak.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import subprocess
import time
from typing import Any

import torch

from engine import EngineConfig, LLMEngine, SamplingParams

SYSTEM = "You are a friendly tutor. Answer in one short sentence."
PARAMS = SamplingParams(max_tokens=8)


def prompts(eng: LLMEngine) -> list[list[int]]:
    hf = eng.tokenizer.hf
    out = []
    for i in range(30):
        ids = hf.apply_chat_template([{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": f"What is {i} plus {i}?"}],
                                     add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def one_run(seed: int, texts: list[list[int]], alone: dict[int, list[list[int]]]) -> dict[str, Any]:
    r = random.Random(seed)
    bs = r.choice([8, 16])
    # a pool that must preempt, and swap space that holds a preempted request (5-6 blocks of 8)
    gpu, cpu = (r.randint(16, 22), r.randint(6, 10)) if bs == 8 else (r.randint(8, 11), r.randint(3, 5))
    cfg = EngineConfig(model="default", device="cpu", dtype="float32", block_size=bs,
                       num_gpu_blocks=gpu, num_cpu_blocks=cpu, preemption_mode="swap",
                       track_kv_content=True)
    eng = LLMEngine(cfg)
    order = list(range(30))
    r.shuffle(order)
    rid_to_i: dict[int, int] = {}
    outs: dict[int, list[int]] = {}
    swaps = steps = 0
    while order or eng.has_pending_work():
        for _ in range(r.randint(0, 8)):
            if order:
                i = order.pop()
                rid_to_i[eng.add_request(texts[i], PARAMS)] = i
        result = eng.step()
        steps += 1
        swaps += sum(e.kind == "swap_out" for e in result.events)
        outs.update({rid_to_i[o.request_id]: list(o.outputs[0].token_ids) for o in result.finished})
    eng.check_invariants()
    expected = alone[cfg.block_size]
    wrong = [i for i in range(30) if outs.get(i) != expected[i]]
    preemptions = eng.snapshot().metrics.extra["preemptions"]
    eng.close()
    return {"seed": seed, "block_size": cfg.block_size, "num_gpu_blocks": cfg.num_gpu_blocks,
            "num_cpu_blocks": cfg.num_cpu_blocks, "steps": steps, "preemptions": preemptions,
            "swap_outs": swaps, "wrong": wrong}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--resume", action="store_true",
                    help="keep the runs already in --out and add these (seeds must not overlap)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    start = time.monotonic()
    base = LLMEngine(EngineConfig(model="default", device="cpu", dtype="float32", num_gpu_blocks=8))
    texts = prompts(base)
    alone = {}
    for bs in (8, 16):
        eng = LLMEngine(EngineConfig(model="default", device="cpu", dtype="float32", block_size=bs,
                                     num_gpu_blocks=1024 // bs))
        alone[bs] = [list(eng.generate(t, PARAMS)[0].outputs[0].token_ids) for t in texts]
        eng.close()
    runs, before = earlier(args.out) if args.resume else ([], 0.0)
    if {r["seed"] for r in runs} & set(range(args.first_seed, args.first_seed + args.runs)):
        raise SystemExit("--resume: these seeds are already in --out")
    code = commit()  # the code this process loaded, whatever HEAD becomes while it runs
    for k in range(args.runs):
        runs.append({**one_run(args.first_seed + k, texts, alone), "commit": code})
        if (k + 1) % 50 == 0 or k + 1 == args.runs:
            bad = sum(len(x["wrong"]) for x in runs)
            print(f"{len(runs)} runs, {bad} wrong answers, {time.monotonic() - start:.0f} s", flush=True)
            if args.out:
                write(args.out, runs, before + time.monotonic() - start, args.threads)


def earlier(path: str | None) -> tuple[list[dict[str, Any]], float]:
    """The runs already in `path` and the seconds they took."""
    if not path:
        raise SystemExit("--resume needs --out")
    with open(path) as f:
        d = json.load(f)
    return d["each_run"], float(d["seconds"])


def commit() -> str:
    """HEAD's short hash, marked '+dirty' when engine/ has uncommitted changes."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True, check=True).stdout.strip()
    try:
        dirty = "+dirty" if git("status", "--porcelain", "engine") else ""
        return git("rev-parse", "--short", "HEAD") + dirty
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write(path: str, runs: list[dict[str, Any]], seconds: float, threads: int) -> None:
    result = {
        "what": "issue 36's classroom workload, randomized, every answer against the request alone",
        "machine": f"{platform.machine()} CPU, torch {torch.__version__}, {threads} thread(s)",
        "model": "SmolLM2-135M-Instruct, float32", "runs": len(runs),
        "wrong_answers": sum(len(r["wrong"]) for r in runs),
        "runs_with_a_wrong_answer": sum(1 for r in runs if r["wrong"]),
        "runs_that_swapped": sum(1 for r in runs if r["swap_outs"]),
        "preemptions": sum(r["preemptions"] for r in runs),
        "swap_outs": sum(r["swap_outs"] for r in runs),
        "seconds": round(seconds), "each_run": runs,
    }
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
