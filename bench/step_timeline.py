"""Where a step's time goes, step by step, on the machine it runs on (issue 44's open rows).

    python bench/step_timeline.py --out "$OUT/timeline.json"          # one GPU: ~3 minutes
    python bench/step_timeline.py --smoke --out /tmp/timeline.json     # a CPU: the script runs

Two parts, each an engine run with the host's phases of every step timed (schedule; the run:
copies and the forward's launch; the picks' launch; the step before landed, and of that the wait
for its tokens) and the collector's pauses and Triton's new compilations counted per step:

- `decode`: the 1.2B model (bench/mem_models.py's `one_b`), n sequences of 512 tokens decoding
  under async scheduling (the roofline row). Async overlaps step t's landing with step t + 1 on
  the device, so a step should take max(host, device); run 10 measured 5.02 ms at 256 sequences
  against a graph of 2.93 ms and a host of ~3.2. Also the device's busy time over a window of
  steady steps (torch.profiler: the union of kernels and copies against the window's wall).
- `prefill`: the hybrid SmolLM2-shaped model against all-full, 32 prompts of 4,096 tokens (run
  10: its prefill steps 0.63 s against 0.33 with cheaper attention kernels); every prefill
  step's phases, the device's busy share over four steady prefill steps, and the host's
  functions over one run's prefill steps (cProfile, by own and by cumulative time).
- `hybrid_decode` (asked by `--only`): the same two models' steady decode steps, 32 sequences
  at 4,096 and 1,024 tokens: each step's phases and the device's busy share.

Every part also times the calls inside the phases (`fine_parts`: the decode pass, the buffers'
prepare, the graph's launch, the feed, the picks' copy to the host, the outputs, the window's
drops, the prefix chain's note), and the decode parts take a cProfile of 30 steady steps.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench import device_step, mem_models  # noqa: E402
from bench import hybrid as prompts_of  # noqa: E402
from bench.device_step import dtype, sync  # noqa: E402
from engine import EngineConfig, LLMEngine, SamplingParams, step_run  # noqa: E402
from engine.runtime import step_picks  # noqa: E402

PHASES = ("schedule", "run", "pick", "land", "wait")


class Phases:
    """Wall time of each phase of the current step (wrappers around the engine's own calls, put
    on for this bench only), with the collector's pauses and Triton's compilations."""

    def __init__(self, eng: LLMEngine) -> None:
        self.now: dict[str, float] = {}
        self._undo: list[tuple[Any, str, Any]] = []
        self._wrap(eng.scheduler, "schedule", "schedule")
        self._wrap(step_run, "execute", "run")
        self._wrap(step_run, "pick", "pick")
        self._wrap(eng._post, "land", "land")  # the in-flight step lands through it
        self._wrap(step_picks.StepPicks, "result", "wait", method=True)
        for owner, name, part in fine_parts(eng):  # inside the phases above: their parts
            self._wrap(owner, name, part, method=isinstance(owner, type))
        gc.callbacks.append(self._gc)
        self._gc_t0 = 0.0

    def _wrap(self, owner: Any, name: str, phase: str, method: bool = False) -> None:
        inner = getattr(owner, name)
        now = self.now

        def timed(*args: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*args, **kw)
            finally:
                now[phase] = now.get(phase, 0.0) + time.perf_counter() - t0

        self._undo.append((owner, name, inner))
        setattr(owner, name, timed)

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            self.now["gc"] = self.now.get("gc", 0.0) + time.perf_counter() - self._gc_t0

    def take(self) -> dict[str, float]:
        out = {k: round(1e3 * v, 3) for k, v in self.now.items()}
        self.now.clear()
        return out

    def close(self) -> None:
        for owner, name, inner in reversed(self._undo):
            setattr(owner, name, inner)
        gc.callbacks.remove(self._gc)


def fine_parts(eng: LLMEngine) -> list[tuple[Any, str, str]]:
    """The calls inside each phase that a step's host time is made of (run 61: the 256-sequence
    step's host 4.2 ms against a graph of 3.0; cProfile's 2.4x overhead blurs which): each one
    timed as `phase.part`, beside its phase. What is left of a step's wall outside the phases is
    the engine's own (`_apply`: the op log, the run record, the prefix tree's note)."""
    from engine.core import postprocess, scheduler
    from engine.runtime import decode_graphs, model_runner, sampler

    parts = [(scheduler.Scheduler, "_schedule_decodes", "schedule.decodes"),
             (model_runner.ModelRunner, "decode", "run.decode"),
             (decode_graphs.DecodeGraphs, "prepare", "run.prepare"),
             (decode_graphs.DecodeGraphs, "replay", "run.replay"),
             (model_runner, "_feed_into", "run.feed"),
             (step_run, "move_blocks", "run.copies"),
             (sampler.TorchScores, "pick_rows", "pick.rows"),
             (step_picks.StepPicks, "__init__", "pick.to_host"),
             (postprocess.Postprocessor, "lazy_outputs", "post.outputs"),
             (type(eng), "_drop_out_of_window", "post.window"),
             (type(eng._chain), "note", "post.chain"),
             (type(eng._run_record), "note", "post.record")]
    if torch.cuda.is_available():
        parts.append((torch.cuda.CUDAGraph, "replay", "run.graph_launch"))
    return parts


def compiled_kernels() -> int | None:
    """Triton kernels compiled in this process so far (None where Triton keeps no such count)."""
    try:
        from paged_kernels import cache_ops, layer_ops, paged_attention
    except ImportError:
        return None
    total = 0
    for module in (paged_attention, cache_ops, layer_ops):
        for fn in vars(module).values():
            caches = getattr(fn, "device_caches", None)
            if isinstance(caches, dict):
                total += sum(len(entry[0]) for entry in caches.values())
    return total


def timed_steps(eng: LLMEngine, device: str, keep: Any, until: int | None = None) -> list[dict]:
    """Every step to the end (or `until` steps): its wall, its phases, and whether
    `keep(result)` holds."""
    phases, rows = Phases(eng), []
    try:
        while eng.has_pending_work() and (until is None or len(rows) < until):
            before = compiled_kernels()
            t0 = time.perf_counter()
            result = eng.step()
            wall = time.perf_counter() - t0
            row = {"wall_ms": round(1e3 * wall, 3), "prefills": result.num_prefills,
                   "decodes": result.num_decodes, "tokens": result.num_batched_tokens, **phases.take()}
            after = compiled_kernels()
            if before is not None and after != before:
                row["compiled"] = after - before
            row["kept"] = bool(keep(result))
            rows.append(row)
    finally:
        phases.close()
    sync(device)
    return rows


def summary(rows: list[dict]) -> dict:
    """Medians of the kept steps' wall and phases, and the sums over them."""
    kept = [r for r in rows if r["kept"]]
    if not kept:
        return {"steps": 0}
    keys = ("wall_ms", *PHASES, "gc", *sorted({k for r in kept for k in r if "." in k}))
    return {"steps": len(kept),
            "median_ms": {k: round(statistics.median(r.get(k, 0.0) for r in kept), 3) for k in keys},
            "sum_ms": {k: round(sum(r.get(k, 0.0) for r in kept), 1) for k in keys},
            "compiled": sum(r.get("compiled", 0) for r in kept)}


def device_busy(eng: LLMEngine, device: str, steps: int) -> dict | None:
    """`steps` steps under torch.profiler: the union of the device's kernels and copies against
    the window's wall (a step the device idles through is host-bound)."""
    if device != "cuda":
        return None
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    sync(device)
    with torch.profiler.profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            eng.step()
        sync(device)
        wall = time.perf_counter() - t0
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    busy, end = 0.0, None
    first = spans[0][0] if spans else 0
    for start, stop in spans:
        if end is None or start > end:
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    span = (end - first) if spans else 0
    return {"steps": steps, "wall_ms": round(1e3 * wall, 2), "device_span_ms": round(span / 1e3, 2),
            "device_busy_ms": round(busy / 1e3, 2),
            "busy_share_of_span": round(busy / span, 3) if span else None}


def host_profile(eng: LLMEngine, steps: int) -> dict[str, list[str]]:
    """`steps` steps under cProfile: the host's functions by own and by cumulative time (a step
    longer than its graph is the host's: which of its calls?)."""
    prof = cProfile.Profile()
    for _ in range(steps):
        prof.enable()
        eng.step()
        prof.disable()
    text, cumulative = io.StringIO(), io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    pstats.Stats(prof, stream=cumulative).sort_stats("cumulative").print_stats(60)
    return {"steps": steps, "by_own": text.getvalue().splitlines()[:45],
            "by_cumulative": cumulative.getvalue().splitlines()[:75]}


def decode(path: str, device: str, sizes: dict) -> dict:
    out = {}
    plen, new = sizes["roof_prompt"], sizes["roof_new"]
    for n in sizes["roof_seqs"]:
        eng = device_step.decoding(path, device, n, plen, new)
        busy = device_busy(eng, device, 10)
        rows = timed_steps(eng, device, lambda r, n=n: r.num_decodes == n and not r.num_prefills,
                           until=sizes["profile_steps"] + 2)
        profile = host_profile(eng, sizes["profile_steps"])
        rows += timed_steps(eng, device, lambda r, n=n: r.num_decodes == n and not r.num_prefills)
        eng.close()
        out[str(n)] = {"busy": busy, "steady": summary(rows[2:]), "steps": rows[:40],
                       "host_profile": profile}
        print(json.dumps({"decode": n, "busy": busy, "steady": out[str(n)]["steady"]}), flush=True)
    return out


def prefill(paths: dict[str, str], device: str, sizes: dict) -> dict:
    """Each prompt length's `prefill_at` (by length, as text)."""
    return {str(plen): prefill_at(paths, device, sizes, plen) for plen in sizes["prompts"]}


def prefill_at(paths: dict[str, str], device: str, sizes: dict, plen: int) -> dict:
    out: dict[str, Any] = {}
    n, new = sizes["requests"], sizes["new"]
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    for name, path in paths.items():
        blocks = (n * -(-(plen + new) // 16) + 256) * (2 if name == "hybrid" else 1)
        eng = LLMEngine(EngineConfig(model=path, device=device, dtype=dtype(device), block_size=16,
                                     num_gpu_blocks=blocks, max_num_seqs=n,
                                     max_num_batched_tokens=8192, async_scheduling=True))
        eng.generate(prompts_of._prompts(2, plen, plen, 2), SamplingParams(max_tokens=8, ignore_eos=True))
        runs = []
        for r in range(2):  # the second run's steps are the ones to read (the first may compile)
            for p in prompts_of._prompts(n, plen, plen, 10 + r):
                eng.add_request(p, params)
            runs.append(timed_steps(eng, device, lambda res: res.num_prefills > 0))
        for p in prompts_of._prompts(n, plen, plen, 30):
            eng.add_request(p, params)
        eng.step()
        eng.step()  # past the first steps: steady prefills of 8,192 tokens
        busy = device_busy(eng, device, 4)
        while eng.has_pending_work():
            eng.step()
        for p in prompts_of._prompts(n, plen, plen, 20):
            eng.add_request(p, params)
        prof = cProfile.Profile()
        while eng.has_pending_work():
            prof.enable()
            result = eng.step()
            prof.disable()
            if not result.num_prefills:
                break
        while eng.has_pending_work():
            eng.step()
        sync(device)
        text, cumulative = io.StringIO(), io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
        pstats.Stats(prof, stream=cumulative).sort_stats("cumulative").print_stats(40)
        eng.close()
        out[name] = {"first_run": summary(runs[0]), "second_run": summary(runs[1]),
                     "second_run_steps": runs[1], "prefill_busy": busy,
                     "host_profile": text.getvalue().splitlines()[:45],
                     "host_cumulative": cumulative.getvalue().splitlines()[:60]}
        print(json.dumps({"prefill": name, "prompt": plen, "first": out[name]["first_run"],
                          "second": out[name]["second_run"]}), flush=True)
    return out


def hybrid_decode(paths: dict[str, str], device: str, sizes: dict) -> dict:
    """The hybrid's and the all-full model's steady decode steps (mem_gpu's hybrid rows: n
    sequences at each prompt length), each step's host phases and the device's busy share: run
    56 read the hybrid's step at 4,096 longer than the full model's (2.41 against 2.23 ms) while
    its graph was shorter (1.57 against 1.74): is the hybrid's step the host's?"""
    out: dict[str, Any] = {}
    n, new = sizes["requests"], sizes["decode_new"]
    for plen in sizes["decode_prompts"]:
        for name, path in paths.items():
            blocks = (n * -(-(plen + new) // 16) + 256) * (2 if name == "hybrid" else 1)
            eng = LLMEngine(EngineConfig(model=path, device=device, dtype=dtype(device),
                                         block_size=16, num_gpu_blocks=blocks, max_num_seqs=n,
                                         max_num_batched_tokens=8192, async_scheduling=True))
            eng.generate(prompts_of._prompts(2, plen, plen, 2),
                         SamplingParams(max_tokens=8, ignore_eos=True))
            for p in prompts_of._prompts(n, plen, plen, 40):
                eng.add_request(p, SamplingParams(max_tokens=new, ignore_eos=True))
            while eng.step().num_prefills or eng.scheduler.waiting:  # to the first decode-only step
                pass
            busy = device_busy(eng, device, 10)
            keep = lambda r: r.num_decodes == n and not r.num_prefills  # noqa: E731
            rows = timed_steps(eng, device, keep, until=sizes["profile_steps"] + 2)
            profile = host_profile(eng, sizes["profile_steps"])
            rows += timed_steps(eng, device, keep)
            eng.close()
            got = {"busy": busy, "steady": summary(rows[2:])}
            out.setdefault(str(plen), {})[name] = {**got, "host_profile": profile}
            print(json.dumps({"hybrid_decode": plen, "model": name, **got}), flush=True)
    return out


FULL = dict(roof_seqs=[256, 64], roof_prompt=512, roof_new=96, requests=32, prompts=[4096], new=16,
            decode_prompts=[4096, 1024], decode_new=96, profile_steps=30)
SMOKE = dict(roof_seqs=[8], roof_prompt=48, roof_new=16, requests=4, prompts=[160], new=4,
             decode_prompts=[160], decode_new=16, profile_steps=4)
PARTS = ("decode", "prefill", "hybrid_decode")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--only", nargs="+", default=["decode", "prefill"], choices=PARTS)
    ap.add_argument("--smoke", action="store_true", help="two layers, tiny sizes (a CPU check)")
    ap.add_argument("--prompts", type=int, nargs="+",
                    help="the prefill part's prompt lengths (default: 4,096; mem_gpu's hybrid "
                         "rows also read 1,024)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sizes = dict(SMOKE if args.smoke else FULL)
    if args.prompts:
        sizes["prompts"] = args.prompts
    layers = 2 if args.smoke else None
    tok, tok_note = mem_models.tokenizer()
    folder = Path(tempfile.mkdtemp(prefix="timeline-"))
    result: dict[str, Any] = {"device": torch.cuda.get_device_name() if args.device == "cuda"
                              else "cpu", "torch": torch.__version__, "tokenizer": tok_note,
                              "sizes": sizes}
    for part in args.only:
        t0 = time.perf_counter()
        if part == "decode":
            result["decode"] = decode(mem_models.build("one_b", folder, tok, args.device, layers),
                                      args.device, sizes)
        else:
            paths = {k: mem_models.build(k, folder, tok, args.device, layers) for k in ("hybrid", "full")}
            part_fn = prefill if part == "prefill" else hybrid_decode
            result[part] = part_fn(paths, args.device, sizes)
        result.setdefault("part_s", {})[part] = round(time.perf_counter() - t0, 1)
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
