"""Issue 43 on two GPUs in one run: the exactness checks first, then the issue's table.

    python bench/tp_gpu.py --out "$OUT"                 # 2 GPUs (H100s): ~8 minutes, < 10.5
    python bench/tp_gpu.py --only small,big --out "$OUT"  # the timing parts: ~6 minutes
    python bench/tp_gpu.py --smoke --out /tmp/tp_gpu     # CPU, gloo: the script runs

Parts, each its own process with its own time budget (a part that fails, hangs or runs out loses
only its own numbers; its JSON is written after every engine run). TP = 2 runs use the
all-reduce PAGEDLAB_TP_ALLREDUCE=auto picks (symmetric memory's one-shot in the graphs where it
sets up, else NCCL: engine/tp/symm_allreduce.py) unless named NCCL, and the table says which each
used:

- `equal`: the 1.1B shape in float32, 8 requests of 64 + 32: TP = 2 (async, then the
  same engine switched to sync) against TP = 1;
- `pytest`: tests/engine/tp/test_tp_gpu.py (float32 TP = 2 equals TP = 1, graphs on and off,
  async, beams, sampling, swaps, prefix hits, drafts; the graphs' sums on symmetric memory, each
  fused with the norm after it);
- `small`: TinyLlama-1.1B's shape, 32 greedy requests of 128 + 128 tokens, bf16: TP = 1 graphed,
  TP = 2 graphed (sum and norm fused: engine/tp/fused_norm.py), each engine timed sync and
  async, then a sync batch under cProfile (where the engine's host time goes; worker 0 profiles
  one of its device steps by host operation):
  decode step, tokens/s, the host and GPU time of a TP = 2 decode step (worker 0's CUDA events);
- `big`: Llama-3-8B's shape (untied LM head), 64 requests of 256 + 64 tokens, bf16: tokens/s of
  TP = 2 against TP = 1, async then sync scheduling;
- `small_allreduce` (only when named): the 1.1B TP = 2 with the one-shot sum and the norm apart
  (run 2's), then with NCCL all-reduces (run 1's);
- `allreduce` (only when named): bench/tp_allreduce.py, the all-reduce alone in a CUDA graph at
  16 KiB to 2 MiB: NCCL, one-shot and two-shot; then with the norm after it: apart and fused.

Writes under --out: tp_gpu.json (every part and the table's figures), tp_gpu.log (the parts'
output), pytest.log, part_small.json, part_big.json, part_equal.json, part_allreduce.json.
Prints the table last. The random models are drawn on the GPU into --model-dir (default
/tmp/pagedlab-tp-models). The default model's tokenizer is found as the engine finds it
(PAGEDLAB_CACHE; a `.gpu_carry` folder at the repository's root is used when the variable is
unset).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}
# (part, seconds it may take at most on two H100s), the exactness checks first; the sum (560 s)
# fits one ten-minute call with room for the machine's start
PARTS = [("equal", 110), ("pytest", 130), ("small", 150), ("big", 230), ("allreduce", 40),
         ("small_allreduce", 130)]
DEFAULT = ("equal", "pytest", "small", "big")  # 620 s: one call's ten minutes hold no more


def _env(smoke: bool) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_DISABLE_PROGRESS_BARS="1",
               TRANSFORMERS_VERBOSITY="error", PYTHONPATH=str(ROOT), **SAFE_ENV)
    # on GPUs a hung start (a capture that never ends) or step fails in time for the part's
    # next run (run 1's slowest start: 34 s, the 8B's TP = 2); the CPU smoke's workers share two
    # loaded cores with a test suite, where importing torch alone took over 90 s
    env.setdefault("PAGEDLAB_TP_START_TIMEOUT_S", "300" if smoke else "90")
    env.setdefault("PAGEDLAB_TP_STEP_TIMEOUT_S", "300" if smoke else "60")
    carried = ROOT / ".gpu_carry"
    if "PAGEDLAB_CACHE" not in env and carried.is_dir():
        env["PAGEDLAB_CACHE"] = str(carried)
    return env


def run_part(name: str, budget: float, args: argparse.Namespace, log: Any) -> dict[str, Any]:
    """One part in its own process group, killed (workers included) past its budget."""
    out = Path(args.out)
    if name == "pytest":
        cmd = [sys.executable, "-m", "pytest", "tests/engine/tp/test_tp_gpu.py", "-q", "-rs",
               "-p", "no:cacheprovider"]
        sink = open(out / "pytest.log", "w")  # noqa: SIM115 - closed below
    else:
        cmd = [sys.executable, str(ROOT / "bench" / "tp_allreduce.py"), "--json",
               str(out / f"part_{name}.json")]
        if name != "allreduce":
            cmd = [sys.executable, str(ROOT / "bench" / "tensor_parallel.py"), "--part", name,
                   "--json", str(out / f"part_{name}.json"), "--model-dir", args.model_dir,
                   "--deadline", str(time.time() + budget - 15)]
        cmd += ["--smoke"] if args.smoke else []
        sink = log
    log.write(f"\n==== part {name} (budget {budget:.0f} s): {' '.join(cmd)}\n")
    log.flush()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(args.smoke), stdout=sink, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        code = proc.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = "timeout"
    finally:
        if sink is not log:
            sink.close()
    seconds = round(time.perf_counter() - start, 1)
    log.write(f"==== part {name}: exit {code} after {seconds} s\n")
    log.flush()
    result: dict[str, Any] = {"exit": code, "seconds": seconds}
    if name == "pytest":
        lines = (out / "pytest.log").read_text(errors="replace").strip().splitlines()
        result["summary"] = lines[-1] if lines else ""
    elif (out / f"part_{name}.json").is_file():
        result |= json.loads((out / f"part_{name}.json").read_text())
    return result


def _get(d: dict[str, Any], *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def _ratio(a: Any, b: Any) -> float | None:
    return round(a / b, 3) if isinstance(a, int | float) and isinstance(b, int | float) and b \
        else None


def _equal(a: Any, b: Any) -> str | None:
    return f"{sum(x == y for x, y in zip(a, b, strict=True))} of {len(a)}" if a and b else None


def _allreduce(run: Any) -> str | None:
    """Which all-reduce a TP run's workers used, in a few words ("symm one-shot", "NCCL", or
    "NCCL, symm failed: why")."""
    a = run.get("allreduce") if isinstance(run, dict) else None
    if not a:
        return None
    if a.get("used") == "symm":
        kinds = "+".join(k.replace("_", "-") for k in sorted(a.get("captured") or {}))
        return f"symm {kinds or 'set up'}"
    if a.get("used") == "gloo":
        return "gloo"
    asked = a.get("requested")
    return "NCCL" if asked == "nccl" or not a.get("why") else f"NCCL, {a['why']}"


def figures(parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's table from the parts' runs (None where a run is missing)."""
    small, big = _small_runs(parts), parts.get("big", {}).get("runs", {})
    step, f = "median_decode_step_ms", {}
    for mode in ("sync", "async"):
        for tp2 in ("tp2", "tp2_unfused", "tp2_nccl"):
            f[f"small_{tp2}_over_tp1_decode_step_{mode}"] = _ratio(
                _get(small, f"{tp2}_{mode}", step), _get(small, f"tp1_{mode}", step))
        f[f"big_tp2_over_tp1_tokens_per_s_{mode}"] = _ratio(
            _get(big, f"tp2_{mode}", "tokens_per_s"), _get(big, f"tp1_{mode}", "tokens_per_s"))
    for name, runs in (("small", small), ("big", big)):
        r = runs.get("tp2_sync") or {}
        f[f"{name}_tp2_sync_host_ms"] = {
            "engine": r.get("median_engine_host_ms"),
            "worker0_to_launch": _get(r, "worker0", "median_host_to_launch_ms"),
            "graph_gpu": _get(r, "worker0", "median_graph_gpu_ms"),
            "unfused_graph_gpu": _get(runs, "tp2_unfused_sync", "worker0", "median_graph_gpu_ms"),
            "nccl_graph_gpu": _get(runs, "tp2_nccl_sync", "worker0", "median_graph_gpu_ms"),
            "step": r.get(step), "tp1_graph_gpu": _get(runs, "tp1_sync", "graph_gpu_ms")}
    eq = parts.get("equal", {}).get("runs", {})
    for mode in ("sync", "async"):
        f[f"float32_tp2_{mode}_equal"] = _equal(_get(eq, "tp1", "outputs"),
                                                _get(eq, f"tp2_{mode}", "outputs"))
        f[f"bf16_small_tp2_{mode}_equal"] = _equal(_get(small, f"tp1_{mode}", "outputs"),
                                                   _get(small, f"tp2_{mode}", "outputs"))
        # two ranks' a + b is the same sum on either all-reduce: the tokens should be too
        f[f"bf16_small_tp2_{mode}_equals_nccl"] = _equal(
            _get(small, f"tp2_{mode}", "outputs"), _get(small, f"tp2_nccl_{mode}", "outputs"))
        # the fused kernel rounds as the one-shot and add_rms_norm do: the same tokens
        f[f"bf16_small_tp2_{mode}_equals_unfused"] = _equal(
            _get(small, f"tp2_{mode}", "outputs"), _get(small, f"tp2_unfused_{mode}", "outputs"))
    f["pytest"] = parts.get("pytest", {}).get("summary")
    f["allreduce_used"] = {f"{p}/{name}": _allreduce(r)
                           for p in ("equal", "small", "small_allreduce", "big")
                           for name, r in parts.get(p, {}).get("runs", {}).items()
                           if name.startswith("tp2")}
    ar = parts.get("allreduce", {})
    f["allreduce_us"] = ar.get("us") or ar.get("skipped") or ar.get("symmetric_memory")
    return f


def _small_runs(parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The 1.1B runs: the part `small`'s, and the all-reduce comparisons where they ran (their
    own TP = 1 baseline only where `small` has none)."""
    return parts.get("small_allreduce", {}).get("runs", {}) | parts.get("small", {}).get("runs", {})


def table(f: dict[str, Any], parts: dict[str, dict[str, Any]]) -> str:
    small, big = _small_runs(parts), parts.get("big", {}).get("runs", {})

    def ms(runs: dict, name: str) -> str:
        return f"{_get(runs, name, 'median_decode_step_ms')} ms"

    def tps(runs: dict, name: str) -> str:
        return f"{_get(runs, name, 'tokens_per_s')} tok/s"

    def ar(runs: dict, name: str) -> str:
        return f"[{_allreduce(runs.get(name))}]"

    hs, hb = f["small_tp2_sync_host_ms"], f["big_tp2_sync_host_ms"]
    host = ("{engine} + {worker0_to_launch} vs {graph_gpu} (step {step}; TP=1 graph "
            "{tp1_graph_gpu})")
    rows = [
        ("1.1B, 32 seqs: TP=2 / TP=1 graphed decode step, sync (goal <= 1.0)",
         f"{f['small_tp2_over_tp1_decode_step_sync']} ({ms(small, 'tp2_sync')} / "
         f"{ms(small, 'tp1_sync')}) {ar(small, 'tp2_sync')}"),
        ("1.1B, 32 seqs: the same, async scheduling",
         f"{f['small_tp2_over_tp1_decode_step_async']} ({ms(small, 'tp2_async')} / "
         f"{ms(small, 'tp1_async')}) {ar(small, 'tp2_async')}"),
        ("1.1B: the same with the sum and the norm apart (run 2), sync / async",
         f"{f['small_tp2_unfused_over_tp1_decode_step_sync']} / "
         f"{f['small_tp2_unfused_over_tp1_decode_step_async']} {ar(small, 'tp2_unfused_sync')}"),
        ("1.1B: the same with NCCL all-reduces, sync / async",
         f"{f['small_tp2_nccl_over_tp1_decode_step_sync']} / "
         f"{f['small_tp2_nccl_over_tp1_decode_step_async']} {ar(small, 'tp2_nccl_sync')}"),
        ("1.1B TP=2 graph GPU per step (worker 0), fused / apart / NCCL / TP=1 graph (ms)",
         f"{hs['graph_gpu']} / {hs['unfused_graph_gpu']} / {hs['nccl_graph_gpu']} / "
         f"{hs['tp1_graph_gpu']}"),
        ("8B, 64 x 256+64: TP=2 / TP=1 tokens/s, async (goal >= 1.5)",
         f"{f['big_tp2_over_tp1_tokens_per_s_async']} ({tps(big, 'tp2_async')} / "
         f"{tps(big, 'tp1_async')}) {ar(big, 'tp2_async')}"),
        ("8B: the same, sync",
         f"{f['big_tp2_over_tp1_tokens_per_s_sync']} ({tps(big, 'tp2_sync')} / "
         f"{tps(big, 'tp1_sync')}) {ar(big, 'tp2_sync')}"),
        ("1.1B TP=2 sync step: engine host + worker 0 to launch vs graph GPU (ms)",
         host.format(**hs)),
        ("8B TP=2 sync step: the same (ms)", host.format(**hb)),
        ("float32 greedy TP=2 = TP=1 (1.1B, 8 x 32 tokens), sync / async",
         f"{f['float32_tp2_sync_equal']} / {f['float32_tp2_async_equal']} "
         f"[{_allreduce(_get(parts, 'equal', 'runs', 'tp2_sync'))}]"),
        ("bf16 greedy TP=2 = TP=1 (1.1B, 32 x 128), sync / async",
         f"{f['bf16_small_tp2_sync_equal']} / {f['bf16_small_tp2_async_equal']}"),
        ("bf16 greedy TP=2 = TP=2 on NCCL, sync / async",
         f"{f['bf16_small_tp2_sync_equals_nccl']} / {f['bf16_small_tp2_async_equals_nccl']}"),
        ("bf16 greedy TP=2 fused = apart, sync / async",
         f"{f['bf16_small_tp2_sync_equals_unfused']} / {f['bf16_small_tp2_async_equals_unfused']}"),
        ("GPU tests (tests/engine/tp/test_tp_gpu.py)", str(f["pytest"])),
    ]
    rows += _allreduce_rows(f)
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{a.ljust(width)}  {b}" for a, b in rows)


def _allreduce_rows(f: dict[str, Any]) -> list[tuple[str, str]]:
    """The part `allreduce` (µs per all-reduce in a graph, by size) and each TP=2 run's."""
    us = f["allreduce_us"]
    rows = []
    if isinstance(us, dict):
        for size, row in us.items():
            cells = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in row.items())
            rows.append((f"all-reduce of {size} bf16 in a graph, 2 GPUs (us)", cells))
    else:
        rows.append(("all-reduce alone (part allreduce)", str(us)))
    used = "; ".join(f"{k} {v}" for k, v in f["allreduce_used"].items())
    rows.append(("all-reduce of each TP=2 run", used or "None"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/tp_gpu"))
    ap.add_argument("--smoke", action="store_true", help="CPU, gloo, a two-layer model")
    ap.add_argument("--model-dir", default="/tmp/pagedlab-tp-models")
    ap.add_argument("--only", default=None, help="parts to run, comma-separated")
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    parts: dict[str, dict[str, Any]] = {}
    with open(Path(args.out) / "tp_gpu.log", "w") as log:
        for name, budget in PARTS:
            if name not in (args.only.split(",") if args.only else DEFAULT):
                continue
            parts[name] = run_part(name, budget * (5 if args.smoke else 1), args, log)
    f = figures(parts)
    result = {"figures": f, "parts": parts, "seconds": round(time.perf_counter() - start, 1)}
    (Path(args.out) / "tp_gpu.json").write_text(json.dumps(result, indent=1))
    print(f"bench/tp_gpu.py: {result['seconds']} s; files in {args.out}")
    for name, p in parts.items():
        print(f"  part {name}: exit {p['exit']} after {p['seconds']} s")
    print(table(f, parts))


if __name__ == "__main__":
    main()
