"""The all-reduce alone, on two GPUs, inside CUDA graphs: NCCL against symmetric memory.

    python bench/tp_allreduce.py --json /tmp/ar.json          # 2 GPUs: ~20 s, mostly start-up
    python bench/tp_allreduce.py --smoke --json /tmp/ar.json  # CPU: writes why it did not run

Two processes (one per GPU, NCCL's group through a FileStore) set up the engine's symmetric-memory
all-reduce (engine/tp/symm_allreduce.set_up, mode `symm` with a 4 MiB buffer, so the self-test
runs the two-shot kernel too), then time, at each message size, NCCL, one-shot (the copy into the
buffer fused into the kernel), one-shot after a separate copy, and two-shot: 20 all-reduces of
bf16 zeros captured in one graph, the graph replayed 20 times after a warm replay and a barrier;
microseconds per all-reduce, on each rank. Sizes: 16 KiB (4 sequences at the 1.1B shape), 128 KiB
(its 32), 512 KiB (the 8B's 64), 2 MiB. Then what a decode graph does with each sum, as rows of
2,048 (the 1.1B's hidden size): one-shot and then `add_rms_norm` (run 2's graphs), the norm
alone, and the one kernel of engine/tp/fused_norm.py that does both without a barrier. NVLink
multicast stays off (engine/tp/launch.py's environment). bench/tp_gpu.py runs this as its part `allreduce`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.tp.launch import SAFE_NCCL_ENV  # noqa: E402

os.environ.update(SAFE_NCCL_ENV)  # before torch

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from engine.tp import fused_norm  # noqa: E402
from engine.tp.symm_allreduce import KiB, MiB, set_up  # noqa: E402
from paged_kernels.layer_ops import add_rms_norm  # noqa: E402

WORLD = 2
SIZES = (16 * KiB, 128 * KiB, 512 * KiB, 2 * MiB)
HIDDEN = 2048  # the rows of the norm timings: the 1.1B shape's hidden size


def _time(fn: Callable[[torch.Tensor], Any], x: torch.Tensor, inner: int = 20,
          reps: int = 20) -> float:
    """Microseconds per call of `fn(x)`, 20 calls captured in one CUDA graph and replayed."""
    fn(x)  # eagerly first: lazy set-ups happen outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn(x)
    graph.replay()
    torch.cuda.synchronize()
    dist.all_reduce(torch.zeros(1, device=x.device))  # both ranks start the timed replays together
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return round(start.elapsed_time(end) * 1000 / (inner * reps), 2)


def rank_main(rank: int, store_path: str, out_path: str) -> None:
    """One rank: the set-up, then every size's kernels, its JSON rewritten after each size."""
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    store = dist.FileStore(store_path, WORLD)
    store.set_timeout(timedelta(seconds=30))  # a rank that fails half-way ends the other's wait
    dist.init_process_group("nccl", store=dist.PrefixStore("ar", store), rank=rank,
                            world_size=WORLD, device_id=device)
    t0 = time.perf_counter()
    symm, why = set_up(store, dist.group.WORLD.group_name, rank, WORLD, device, torch.bfloat16,
                       4 * MiB, "symm")
    rows = max(SIZES) // 2 // HIDDEN
    with_norm, norm_why = fused_norm.set_up(store, dist.group.WORLD.group_name, rank, WORLD,
                                            device, torch.bfloat16, rows, HIDDEN)
    out: dict[str, Any] = {"rank": rank, "setup_s": round(time.perf_counter() - t0, 2),
                           "symmetric_memory": why or "ok", "fused_norm": norm_why or "ok",
                           "allreduce": symm.describe() if symm else None, "us": {}}
    for size in SIZES:
        x = torch.zeros(size // 2, dtype=torch.bfloat16, device=device)
        row = {"nccl": _time(lambda t: dist.all_reduce(t), x)}
        if symm is not None:
            fused = symm.fused_copy
            row["one_shot"] = _time(lambda t: symm.reduce(t, "one_shot"), x)
            symm.fused_copy = False
            row["one_shot_copy_first"] = _time(lambda t: symm.reduce(t, "one_shot"), x)
            symm.fused_copy = fused
            row["two_shot"] = _time(lambda t: symm.reduce(t, "two_shot"), x)
        row |= _with_norm(symm, with_norm, x.view(-1, HIDDEN))
        out["us"][f"{size // KiB} KiB"] = row
        Path(out_path).write_text(json.dumps(out, indent=1))
    Path(out_path).write_text(json.dumps(out, indent=1))
    sys.stdout.flush()
    os._exit(0)  # no teardown: NCCL's and symmetric memory's can hang at exit


def _with_norm(symm: Any, fused: Any, x: torch.Tensor) -> dict[str, float]:
    """The sum of `x` ([rows, HIDDEN]) then the residual add and RMSNorm, as a decode graph
    does them: apart (one-shot, then add_rms_norm), the norm alone, and fused in one kernel."""
    res, w = torch.ones_like(x), torch.ones(x.shape[1], dtype=x.dtype, device=x.device)
    row = {"add_rms_norm_alone": _time(lambda t: add_rms_norm(t, res, w, 1e-5), x)}
    if symm is not None:
        row["one_shot_then_norm"] = _time(
            lambda t: add_rms_norm(symm.reduce(t, "one_shot"), res, w, 1e-5), x)
    if fused is not None:
        row["fused_norm"] = _time(lambda t: fused(t, res, w, 1e-5), x)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU: only say why it does not run")
    ap.add_argument("--timeout", type=float, default=36.0, help="seconds the ranks may take")
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.store, args.json)
        return
    out: dict[str, Any] = {"part": "allreduce", "torch": torch.__version__,
                           "gpus": torch.cuda.device_count()}
    if args.smoke or torch.cuda.device_count() < WORLD:
        out["skipped"] = f"needs {WORLD} GPUs (torch sees {torch.cuda.device_count()})"
    else:
        out |= _ranks(args.timeout)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(json.dumps(out.get("us", out.get("skipped")), indent=1))


def _ranks(timeout_s: float) -> dict[str, Any]:
    """Start the two ranks, wait for them (`timeout_s` at most), and gather what they wrote."""
    folder = Path(tempfile.mkdtemp(prefix="pagedlab-allreduce-"))
    env = dict(os.environ, PYTHONPATH=str(ROOT), **SAFE_NCCL_ENV)
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--store",
                               str(folder / "store"), "--json", str(folder / f"rank{r}.json")],
                              env=env) for r in range(WORLD)]
    deadline = time.monotonic() + timeout_s
    codes: list[Any] = []
    for p in procs:  # a rank that hangs (a barrier never met) is killed; what it wrote stays
        try:
            codes.append(p.wait(max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            codes.append("timeout")
    ranks = [json.loads(f.read_text()) if f.is_file() else None
             for f in (folder / f"rank{r}.json" for r in range(WORLD))]
    return {"exit_codes": codes, "ranks": ranks, "us": (ranks[0] or {}).get("us"),
            "symmetric_memory": (ranks[0] or {}).get("symmetric_memory")}


if __name__ == "__main__":
    main()
