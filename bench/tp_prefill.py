"""Issue 43: where the 8B shape's prefill spends its time under TP = 2 (two H100s).

Run 3b measured the one prefill step of 64 prompts x 256 tokens (16,384 tokens) at 0.285 s under
TP = 2 against 0.369 s on one GPU: 1.29x, where the decode steps gained 1.53x. This splits the
TP = 2 step into what a rank computes and what the sums cost:

- `tp1`: the 8B shape on one GPU: the prefill step's wall time (median of 3), then one step
  under torch.profiler, its GPU time by kind of kernel (matmul, attention, norm, ...);
- `half`: the model one rank of TP = 2 computes (query and KV heads and the MLP halved; the
  hidden size, the layers and the replicated embedding and LM head kept), on one GPU: the same;
  its decode graph at 64 sequences too (the TP = 2 decode graph less this: what its sums cost);
- `tp2`: the same prefill step on a TP = 2 engine (median of 3);
- `nccl`: NCCL's all-reduce of one prefill's activations (16,384 x 4,096 bf16: 128 MiB) and of
  one decode step's (64 x 4,096: 512 KiB), eager, between two processes.

    python bench/tp_prefill.py --out "$OUT"            # 2 GPUs: ~3 minutes
    python bench/tp_prefill.py --smoke --out /tmp/tpp   # CPU, gloo, a two-layer model

Writes tp_prefill.json under --out after every part.
"""

from __future__ import annotations

import os

for _k, _v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
               "NVSHMEM_DISABLE_NVLS": "1"}.items():
    os.environ[_k] = _v

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.tensor_parallel import _replay_ms, drop_loaded_models, prompts  # noqa: E402
from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from engine.tp.models import LLAMA_8B, TINY_KV2, save_random_llama  # noqa: E402
from engine.tp.worker_steps import kernel_times  # noqa: E402

# a kernel's kind, by the first of these its name contains (lower case)
KINDS = [("allreduce", ("nccl", "allreduce")), ("attention", ("attention", "attn")),
         ("norm", ("rms", "norm")), ("rope", ("rope",)), ("silu", ("silu",)),
         ("matmul", ("gemm", "nvjet", "cutlass", "sm90", "matmul", "xmma")),
         ("copy", ("copy", "memcpy", "memset", "fill", "cat", "index"))]


def half_shape(shape: dict[str, int]) -> dict[str, int]:
    """What one rank of TP = 2 computes: heads, KV heads and the MLP halved."""
    return shape | {"num_attention_heads": shape["num_attention_heads"] // 2,
                    "num_key_value_heads": shape["num_key_value_heads"] // 2,
                    "intermediate_size": shape["intermediate_size"] // 2}


def engine(model: str, tp: int, device: str, dtype: str, n: int, plen: int) -> LLMEngine:
    return LLMEngine(EngineConfig(
        model=model, tensor_parallel_size=tp, device=device, dtype=dtype, block_size=16,
        num_gpu_blocks=n * -(-(plen + 8) // 16) + 16, max_num_seqs=n, enable_prefix_caching=False,
        max_num_batched_tokens=n * plen, async_scheduling=False))


def prefill_step(eng: LLMEngine, batch: list[list[int]]) -> float:
    """Seconds of the step that prefills the whole batch (each request then runs out)."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    for p in batch:
        eng.add_request(p, params)
    t0 = time.perf_counter()
    res = eng.step()
    dt = time.perf_counter() - t0
    if res.num_prefills != len(batch):
        raise RuntimeError(f"the step prefilled {res.num_prefills} of {len(batch)} prompts")
    while eng.has_pending_work():
        eng.step()
    return dt


def kernel_kinds(rows: list[tuple[str, float, int]]) -> dict[str, Any]:
    """A profiled step's GPU time (ms) by kind of kernel, and its ten longest kernels."""
    by_kind: dict[str, float] = defaultdict(float)
    for name, ms, _ in rows:
        low = name.lower()
        by_kind[next((k for k, words in KINDS if any(w in low for w in words)), "other")] += ms
    return {"gpu_ms_by_kind": {k: round(v, 2) for k, v in sorted(by_kind.items(),
                                                                  key=lambda kv: -kv[1])},
            "gpu_ms_total": round(sum(by_kind.values()), 2),
            "top": [{"ms": ms, "calls": c, "kernel": k} for k, ms, c in rows[:10]]}


def one_gpu(model: str, device: str, dtype: str, n: int, plen: int) -> dict[str, Any]:
    eng = engine(model, 1, device, dtype, n, plen)
    try:
        batch = prompts(eng, n, plen)
        prefill_step(eng, batch)  # warm-up: the kernels compiled for these shapes
        walls = [prefill_step(eng, batch) for _ in range(3)]
        out: dict[str, Any] = {"prefill_s": [round(w, 4) for w in walls],
                               "median_prefill_s": round(statistics.median(walls), 4)}
        if device == "cuda":
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=acts) as prof:
                prefill_step(eng, batch)
                torch.cuda.synchronize()
            out["profile"] = kernel_kinds(kernel_times(prof, top=200))
            eng.generate(batch, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
            out["decode_graph_gpu_ms"] = _replay_ms(eng, n)
        return out
    finally:
        eng.close()
        drop_loaded_models()


def tp2(model: str, device: str, dtype: str, n: int, plen: int, trace: str | None = None
        ) -> dict[str, Any]:
    """The prefill step on a TP = 2 engine: its wall time, the engine's own host time in it
    (less the wait for worker 0's reply), worker 0's times of it (from the message to the
    forward, the forward's GPU time, the whole step there), and its fifth prefill profiled
    there by kernel (each timed prefill is the engine's one general step), its timeline written
    to `trace` (Chrome's trace format)."""
    os.environ["PAGEDLAB_TP_TIMING"] = "1"
    os.environ["PAGEDLAB_TP_PROFILE_STEP"] = "5"  # the warm-up, three timed, then this one
    if trace:
        os.environ["PAGEDLAB_TP_PROFILE_TRACE"] = trace
    eng = engine(model, 2, device, dtype, n, plen)
    try:
        batch = prompts(eng, n, plen)
        prefill_step(eng, batch)
        eng.runtime.step_timings()  # forget the warm-up's
        walls, hosts = [], []
        for _ in range(3):
            waited = eng.runtime.reply_wait_s
            walls.append(prefill_step(eng, batch))
            hosts.append(walls[-1] - (eng.runtime.reply_wait_s - waited))
        eager = eng.runtime.step_timings()["eager"]
        prefill_step(eng, batch)
        profile = eng.runtime.step_timings()["profile"]
        return {"prefill_s": [round(w, 4) for w in walls],
                "median_prefill_s": round(statistics.median(walls), 4),
                "engine_host_ms_upper_bound": [round(1e3 * h, 2) for h in hosts],
                "worker0": eager, "worker0_profile": profile and kernel_kinds(profile),
                "allreduce": eng.engine_info()["all-reduce"]}
    finally:
        eng.close()


def _nccl_rank(rank: int, path: str, sizes: dict[str, int], backend: str, out: Any) -> None:
    import torch.distributed as dist

    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=2)
    res = {}
    for name, numel in sizes.items():
        t = torch.ones(numel, dtype=torch.bfloat16, device=dev)
        reps = 20 if dev.type == "cuda" else 2
        for _ in range(3):
            dist.all_reduce(t)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(t)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        us = (time.perf_counter() - t0) / reps * 1e6
        res[name] = {"us": round(us, 1), "GB/s": round(numel * 2 / us / 1e3, 1)}
    if rank == 0:
        out.put(res)
    dist.destroy_process_group()


def nccl(smoke: bool, hidden: int, n: int, plen: int) -> dict[str, Any]:
    import tempfile

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    path = tempfile.mktemp(prefix="pagedlab-nccl-")
    sizes = {"prefill": n * plen * hidden, "decode": n * hidden}
    procs = [ctx.Process(target=_nccl_rank, args=(r, path, sizes, "gloo" if smoke else "nccl", q))
             for r in range(2)]
    for p in procs:
        p.start()
    res = q.get(timeout=120)
    for p in procs:
        p.join(30)
    return res | {"bytes": {k: v * 2 for k, v in sizes.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU, gloo, a two-layer model")
    ap.add_argument("--model-dir", default="/tmp/pagedlab-tp-models")
    ap.add_argument("--parts", default="nccl,tp1,half,tp2", help="which, comma-separated")
    args = ap.parse_args()
    device, dtype = ("cpu", "float32") if args.smoke else ("cuda", "bfloat16")
    n, plen = (4, 16) if args.smoke else (64, 256)
    shape = TINY_KV2 if args.smoke else LLAMA_8B
    half = shape if args.smoke else half_shape(shape)  # 2 KV heads do not halve to a TP = 2 rank
    root = Path(args.model_dir)

    def folder(name: str, s: dict[str, int]) -> str:
        if args.smoke:
            return str(save_random_llama(root / f"smoke-{name}", s))
        return str(save_random_llama(root / f"llama-{name}", s, dtype=torch.bfloat16,
                                     device="cuda", tie=False))

    out: dict[str, Any] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                           "torch": torch.__version__, "spec": [n, plen], "shape": shape,
                           "half_shape": half, "parts": {}}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    parts = [("nccl", lambda: nccl(args.smoke, shape["hidden_size"], n, plen)),
             ("tp1", lambda: one_gpu(folder("big", shape), device, dtype, n, plen)),
             ("half", lambda: one_gpu(folder("big-half", half), device, dtype, n, plen)),
             ("tp2", lambda: tp2(folder("big", shape), device, dtype, n, plen,
                                trace=str(Path(args.out) / "tp2_prefill_trace.json")))]
    for name, fn in parts:
        if name not in args.parts.split(","):
            continue
        t0 = time.perf_counter()
        try:
            out["parts"][name] = fn() | {"seconds": round(time.perf_counter() - t0, 1)}
        except Exception as err:  # noqa: BLE001 - the other parts' numbers stay
            traceback.print_exc()
            out["parts"][name] = {"error": f"{type(err).__name__}: {str(err)[:1500]}"}
        (Path(args.out) / "tp_prefill.json").write_text(json.dumps(out, indent=1))
        print(name, json.dumps(out["parts"][name])[:1500], flush=True)


if __name__ == "__main__":
    main()
