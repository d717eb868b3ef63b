"""Issue 44 in one GPU run: drafts that cost nothing when they fail, the hybrid cache, the CPU tier
at the bus's speed, the 1.2B step against its roofline; the GPU tests of what changed; and
where the step's time goes (kernels timed alone, the attention's tiles swept, `ncu` if there).

    python bench/mem_gpu.py --out "$OUT"                  # one H100: under 9 minutes
    python bench/mem_gpu.py --smoke --out /tmp/mem         # a CPU: every part runs, tiny sizes

Writes into --out (at most 8 files): mem_gpu.json (every number; rewritten after each part),
profiles.txt (host and kernel profiles), gpu_pytest.log, kernel_probe.json, ncu.csv (where
`ncu` runs), and prints the table last. Each part fails alone (its error goes into the JSON and
the others go on), and a part that would start past the time budget is skipped and said so.
The startup heap is settled first, as a warm GPU engine settles it (frozen, young collections
rarer: engine/runtime/collector.py; `--heap as-is`: not; `--heap off`: and the collector is
off; a GPU engine settles the heap after its warm-up either way), and each part's collector
pauses are counted.
Models: bench/mem_models.py; measurements: bench/mem_parts.py and the benches they reuse.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from bench import mem_models, mem_parts, tier  # noqa: E402
from bench.host_speed import python_ms  # noqa: E402
from bench.measure import GcPauses  # noqa: E402
from bench.mem_table import table  # noqa: E402
from bench.spinners import spinning  # noqa: E402
from engine.runtime.collector import settle_heap  # noqa: E402

# sizes: bench/tier.py's for the tier's parts, then this run's (its repeats serve both)
# (the rejects' and the hybrid's rounds by turns: their rows are ratios of host-bound runs)
FULL = {**tier.FULL, **dict(batches=[1, 8, 64], new=128, repeats=5, reject_repeats=15,
                            hybrid_prompts=[1024, 4096], hybrid_requests=32, hybrid_new=256,
                            hybrid_rounds=5, roof_seqs=[64, 256], roof_prompt=512, roof_new=96,
                            layers=None, budget_s=480)}
SMOKE = {**tier.SMOKE, **dict(batches=[1, 4], new=12, repeats=2, reject_repeats=3,
                              hybrid_prompts=[160], hybrid_requests=4, hybrid_new=16,
                              hybrid_rounds=2, roof_seqs=[4], roof_prompt=48, roof_new=8, layers=2,
                              budget_s=1800)}
#: the GPU tests of what issue 44 changed (tests that need the real SmolLM2 weights aside)
TESTS = ["tests/paged_kernels/test_sliding_window.py::test_triton_split_k_with_a_window",
         "tests/paged_kernels/test_sliding_window.py::test_triton_bf16_with_a_window",
         "tests/engine/runtime/test_sliding_window_models.py::"
         "test_on_a_gpu_graphs_and_triton_kernels_past_the_window_equal_hf",
         "tests/engine/runtime/test_drafts_on_cuda.py::test_drafts_through_the_graphs_change_no_greedy_token[True]",
         "tests/engine/runtime/test_drafts_on_cuda.py::test_sampled_drafts_that_are_rejected_keep_the_tokens_and_soon_stop",
         "tests/engine/runtime/test_tier_copies.py",
         "tests/engine/runtime/test_decode_graphs.py::test_graph_replay_equals_eager_on_cuda",
         # async scheduling on a GPU: the fed tokens gathered inside the decode graphs
         "tests/engine/test_async_scheduling.py::test_real_async_scheduling_changes_no_output[cuda]",
         "tests/engine/runtime/test_persistent_batch.py", "tests/engine/runtime/test_step_clock.py",
         "tests/engine/core/test_draft_policy.py", "tests/paged_kernels/test_kernel_ops.py",
         "tests/engine/runtime/test_prefill_graphs.py", "tests/paged_kernels/test_tile_map.py"]
#: each part's seconds on an H100 (the earlier runs'), to skip what the budget no longer holds
ESTIMATE = {"spec": 45, "rejects": 50, "hybrid": 50, "tier": 45, "roofline": 80, "tests": 120,
            "probe": 40, "ncu": 60, "rejects_order": 40}
#: parts only an `--only` asks for: diagnostics of one question, not rows of the table
ASKED_ONLY = ("rejects_order",)
TESTS_AT_LEAST = 100  # seconds the tests get whatever the parts before them took


def worth_starting(part: str, left: float) -> bool:
    """Whether a part may start with `left` seconds of the budget: a measurement only where half
    its estimate fits beside the tests' share; the tests always; the diagnostics at the end on
    a quarter of theirs."""
    if part == "tests":
        return True
    if part in ("probe", "ncu"):
        return left >= 0.25 * ESTIMATE[part]
    return left >= 0.5 * ESTIMATE[part] + TESTS_AT_LEAST


class Run:
    """The run's models, results and files; each part is a method."""

    def __init__(self, out: Path, device: str, sizes: dict) -> None:
        self.out, self.device, self.sizes = out, device, sizes
        self.folder = Path(tempfile.mkdtemp(prefix="mem-gpu-"))
        self.tok, tok_note = mem_models.tokenizer()
        self.paths: dict[str, str] = {}
        self.profiles: list[str] = []
        self.result: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                             "torch": torch.__version__, "tokenizer": tok_note,
                             "sizes": {k: v for k, v in sizes.items() if k != "budget_s"}}

    def model(self, kind: str) -> str:
        if kind not in self.paths:
            t0 = time.perf_counter()
            self.paths[kind] = mem_models.build(kind, self.folder, self.tok, self.device,
                                                self.sizes["layers"])
            self.result.setdefault("build_s", {})[kind] = round(time.perf_counter() - t0, 1)
        return self.paths[kind]

    def spec(self) -> dict:
        got = mem_parts.spec_greedy(self.model("loops"), self.device, self.sizes)
        got["hf_prompt_lookup"] = mem_parts.hf_lookup(self.model("loops"), self.device, self.sizes)
        return got

    def rejects(self) -> dict:
        return {"smollm2": mem_parts.spec_rejects(self.model("rejects_smol"), self.device, self.sizes),
                "llama1b": mem_parts.spec_rejects(self.model("rejects_1b"), self.device, self.sizes)}

    def rejects_order(self) -> dict:
        return {"smollm2": mem_parts.rejects_order(self.model("rejects_smol"), self.device,
                                                   self.sizes),
                "llama1b": mem_parts.rejects_order(self.model("rejects_1b"), self.device, self.sizes)}

    def hybrid(self) -> dict:
        return mem_parts.hybrid({"hybrid": self.model("hybrid"), "full": self.model("full")},
                                self.device, self.sizes)

    def tier(self) -> dict:
        got = mem_parts.tier_all(self.model("one_b"), self.device, self.sizes)
        profile = got.pop("profile")
        for name, p in profile.items():
            self.profiles += [f"== tier repeat of a {self.sizes['doc']}-token document, {name}: "
                              f"{p['wall_ms']} ms", *p["host"], *p["device"]]
        return got

    def roofline(self) -> dict:
        got = mem_parts.roofline(self.model("one_b"), self.device, self.sizes)
        for n, row in got.items():
            if isinstance(row, dict) and "host_profile" in row:
                self.profiles += [f"== 1.2B decode, {n} sequences: host (cProfile)",
                                  *row.pop("host_profile")]
        return got

    def tests(self) -> dict:
        log = self.out / "gpu_pytest.log"
        timeout = max(TESTS_AT_LEAST, int(self.left() - 0.25 * ESTIMATE["probe"]))
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not model",
               *TESTS]
        t0 = time.perf_counter()
        try:
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
            text, rc = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as err:
            text, rc = f"{err.stdout or ''}\n{err.stderr or ''}\nTIMEOUT after {timeout} s", -1
        log.write_text(text if isinstance(text, str) else text.decode())
        last = [line for line in str(text).splitlines() if line.strip()][-1:] or [""]
        return {"returncode": rc, "summary": last[0], "seconds": round(time.perf_counter() - t0, 1)}

    def probe(self) -> dict:
        from bench import kernel_probe

        if self.device != "cuda":
            return {"skipped": "needs a GPU"}
        got = {str(n): {"kernels": kernel_probe.layer_kernels(n, self.sizes["roof_prompt"] + 48),
                        "attention_sweep": kernel_probe.sweep(n, self.sizes["roof_prompt"] + 48)}
               for n in self.sizes["roof_seqs"]}
        (self.out / "kernel_probe.json").write_text(json.dumps(got, indent=1))
        return {n: {"attention_best": v["attention_sweep"][:3]} for n, v in got.items()}

    def ncu(self) -> dict:
        ncu = shutil.which("ncu") or next(iter(sorted(Path("/opt/nvidia").glob(
            "nsight-compute/*/ncu"))), None)
        if self.device != "cuda" or not ncu:
            return {"skipped": "no GPU or no ncu"}
        csv = self.out / "ncu.csv"
        cmd = [str(ncu), "--csv", "--clock-control", "none", "--section", "SpeedOfLight",
               "--kernel-name", "regex:paged_attn|merge|rms_norm|silu|nvjet|gemm|sm90",
               "--launch-count", "24", sys.executable, os.path.join(ROOT, "bench", "kernel_probe.py"),
               "--once", "--seqs", "64"]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                              timeout=max(20, int(self.left())))
        csv.write_text(done.stdout[-4_000_000:] + "\n" + done.stderr[-20_000:])
        return {"returncode": done.returncode, "lines": done.stdout.count("\n")}

    def left(self) -> float:
        return self.sizes["budget_s"] - (time.perf_counter() - START)

    def save(self) -> None:
        (self.out / "mem_gpu.json").write_text(json.dumps(self.result, indent=1, default=str))
        (self.out / "profiles.txt").write_text("\n".join(self.profiles))


START = time.perf_counter()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--only", nargs="+", default=[p for p in ESTIMATE if p not in ASKED_ONLY],
                    choices=list(ESTIMATE))
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results/mem_gpu")
    ap.add_argument("--heap", choices=["frozen", "as-is", "off"],
                    default=os.environ.get("PAGEDLAB_BENCH_HEAP", "frozen"),
                    help="frozen (default): the startup heap settled before the parts, as a GPU "
                         "engine settles its own after its warm-up; as-is: only the engines' "
                         "settling; off: frozen, and the collector off while the parts measure "
                         "(are the hybrid's slow prefill steps its collections?). The default "
                         "comes from $PAGEDLAB_BENCH_HEAP, so bench/ab_trees.py --envs compares them")
    ap.add_argument("--gc-census", type=int, default=0, metavar="N",
                    help="before each part's first N full collections, count what they walk: "
                         "the objects of each generation and their commonest types")
    ap.add_argument("--spin", type=int, default=int(os.environ.get("PAGEDLAB_BENCH_SPIN", "0")),
                    metavar="N", help="keep N other CPUs busy while the parts run (bench/spinners.py; "
                                      "default $PAGEDLAB_BENCH_SPIN, so ab_trees --envs compares)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = Run(out, args.device, dict(SMOKE if args.smoke else FULL))
    if args.heap in ("frozen", "off"):
        settle_heap()
    if args.heap == "off":
        gc.disable()  # a process of its own: nothing else runs in it (the GPU tests are another)
    run.result["heap"] = {"mode": args.heap, "frozen_objects": gc.get_freeze_count(),
                          "thresholds": gc.get_threshold()}
    print(f"[mem_gpu] {run.result['device']}, torch {torch.__version__}, tokenizer: "
          f"{run.result['tokenizer']}, heap: {run.result['heap']}", flush=True)
    with spinning(args.spin) as busy:
        run.result["busy_cpus"] = busy
        run_parts(run, args)
    run.result["total_s"] = round(time.perf_counter() - START, 1)
    run.save()
    print(table(run.result), flush=True)


def run_parts(run: Run, args: argparse.Namespace) -> None:
    for part in args.only:
        if not worth_starting(part, run.left()):
            run.result[part] = {"skipped": f"{run.left():.0f} s of the budget left"}
            continue
        # the host's speed as the part starts (run 18: two-valued; fast about 1.6-1.8 ms)
        run.result.setdefault("python_ms", {})[part] = python_ms()
        t0 = time.perf_counter()
        with GcPauses(census=args.gc_census) as pauses:
            try:
                run.result[part] = getattr(run, part)()
            except Exception as err:  # noqa: BLE001 - one part failing must not lose the others
                run.result[part] = {"error": f"{type(err).__name__}: {err}",
                                    "trace": traceback.format_exc().splitlines()[-12:]}
        run.result.setdefault("part_s", {})[part] = round(time.perf_counter() - t0, 1)
        run.result.setdefault("gc_pauses", {})[part] = pauses.summary()
        print(f"[mem_gpu] {part}: {run.result['part_s'][part]} s, "
              f"{'error' if 'error' in run.result[part] else 'done'}", flush=True)
        run.save()


if __name__ == "__main__":
    main()
