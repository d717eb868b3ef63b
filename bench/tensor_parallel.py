"""Tensor parallelism measured: one engine's runs, and the parts of issue 43's two-GPU table.

`run()` builds one engine (TP = 1 in this process, or TP = N worker processes, with the
all-reduce PAGEDLAB_TP_ALLREDUCE names), then, in each scheduling mode asked (one start-up for
both), runs a greedy batch to completion after a short warm-up at the same batch size. It
reports tokens/s, every pure decode step's wall time, the engine's own host time in it (the step
less the time spent waiting for worker 0's reply), worker 0's timings of its decode graph (host
work from the message to the launch, and the graph's GPU time by CUDA events:
PAGEDLAB_TP_TIMING=1), the all-reduce the workers used, the bytes on the wire, the bytes each
GPU holds, and the outputs. A one-process engine's decode graph is timed the same way, replayed
after the run.

Each part (`--part small|equal|big`) is one process: bench/tp_gpu.py starts them with a time
budget each, so a part that fails or hangs loses only its own numbers. A part writes its JSON
after every run; a TP engine that fails to start is tried again with NCCL in its graphs, then
with eager workers, and the rest of the part starts there.

    python bench/tensor_parallel.py --part small --json /tmp/small.json          # 2 GPUs
    python bench/tensor_parallel.py --part small --smoke --json /tmp/small.json  # CPU, gloo
"""

from __future__ import annotations

import os

# before torch: the workers inherit this environment (engine/tp/launch.py forces it too)
for _k, _v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
               "NVSHMEM_DISABLE_NVLS": "1"}.items():
    os.environ[_k] = _v

import argparse  # noqa: E402
import cProfile  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import pstats  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.host_facts import host_cpus  # noqa: E402
from bench.measure import top_functions  # noqa: E402
from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from engine.runtime.models import cache_root  # noqa: E402
from engine.tp.models import LLAMA_1B, LLAMA_8B, TINY_KV2, save_random_llama  # noqa: E402

Spec = tuple[int, int, int]  # requests, prompt tokens, new tokens
Modes = tuple[tuple[str, bool], ...]  # (result name, async scheduling) measured on one engine


def prompts(eng: LLMEngine, n: int, length: int) -> list[list[int]]:
    text = ("Tensor parallelism splits every layer's heads over GPUs; the scheduler keeps one "
            "block table and sends each step's changes to every worker. ") * 80
    ids = eng.tokenizer.encode(text)
    return [ids[i * 5: i * 5 + length] for i in range(n)]


def _median_ms(xs: list[float]) -> float | None:
    return round(1e3 * statistics.median(xs), 4) if xs else None


def run(model: str, tp: int, dtype: str, device: str, spec: Spec, graphs: bool,
        allreduce: str, modes: Modes, record: Any, deadline: float) -> None:
    """One engine, then one greedy batch in each of `modes` ((name, async scheduling), in
    turn); `record(name, result)` after each. The first mode is the engine's own; a later one
    switches the idle engine's scheduling (`_set_async`): one start-up for both numbers. A TP
    engine must start async (its workers then keep their picks on the device, which a
    synchronous step just does not read). `allreduce`: PAGEDLAB_TP_ALLREDUCE for the workers;
    "auto-unfused" is auto with each sum and the norm after it apart (PAGEDLAB_TP_FUSED_NORM=0:
    run 2's graphs)."""
    n, plen, new = spec
    if tp > 1 and not modes[0][1] and any(a for _, a in modes[1:]):
        raise ValueError("a TP engine started synchronous cannot switch to async scheduling")
    os.environ["PAGEDLAB_TP_GRAPHS"] = "1" if graphs else "0"
    os.environ["PAGEDLAB_TP_TIMING"] = "1"
    # worker 0 profiles the host work of one device step in the middle of the `_profile` batch
    # (each batch runs new + 2 device steps: 3 after its warm-up's prefill, new - 1 after its
    # own), never in a batch whose figures the table reads
    at = next((i for i, (name, _) in enumerate(modes) if name.endswith("_profile")), None)
    os.environ["PAGEDLAB_TP_PROFILE_DEVICE_STEP"] = "0" if at is None else str(
        at * (new + 2) + 3 + (new - 1) // 2)
    mode, _, variant = allreduce.partition("-")
    os.environ["PAGEDLAB_TP_ALLREDUCE"] = mode
    os.environ["PAGEDLAB_TP_FUSED_NORM"] = "0" if variant == "unfused" else "1"
    cfg = EngineConfig(model=model, tensor_parallel_size=tp, device=device, dtype=dtype,
                       block_size=16, num_gpu_blocks=n * -(-(plen + new) // 16) + 16,
                       max_num_seqs=n, enable_prefix_caching=False,  # no hits between runs
                       max_num_batched_tokens=max(2048, n * plen), async_scheduling=modes[0][1])
    start = time.perf_counter()
    eng = LLMEngine(cfg)
    try:
        startup = round(time.perf_counter() - start, 2)
        if tp == 1 and not graphs:
            eng.runtime.runner.graphs.use_graphs = eng.runtime.runner.graphs.pad = False
        graph_ms = None
        for i, (name, async_) in enumerate(modes):
            if i and deadline - time.time() < 20:
                record(name, {"skipped": f"{deadline - time.time():.0f} s left"})
                continue
            _set_async(eng, async_)
            out = _measure(eng, tp, spec, profile=name.endswith("_profile")) | {
                "tensor_parallel_size": tp, "graphs": graphs, "async_scheduling": async_,
                "dtype": dtype, "startup_s": startup if i == 0 else None,
                "same_engine_as": modes[0][0] if i else None, "per_gpu": _held(eng, tp, device),
                "cpus": host_cpus()}
            if tp == 1 and device == "cuda" and graphs:
                graph_ms = graph_ms if graph_ms is not None else _replay_ms(eng, n)
                out["graph_gpu_ms"] = graph_ms
            record(name, out)
    finally:
        eng.close()


def _set_async(eng: LLMEngine, on: bool) -> None:
    """The bench's switch of an idle engine's scheduling mode, which is read at every step (the
    config's flag; a TP runtime's copy of it). Not an engine API."""
    object.__setattr__(eng.config, "async_scheduling", on)
    if hasattr(eng.runtime, "_async"):
        eng.runtime._async = on


def _measure(eng: LLMEngine, tp: int, spec: Spec, profile: bool = False) -> dict[str, Any]:
    """A warm-up at the batch size, then the timed batch: the numbers of issue 43's table.
    `profile`: the engine's steps run under cProfile (its slower steps are not the table's),
    and the functions taking the most of the engine's own time come back."""
    n, plen, new = spec
    batch = prompts(eng, n, plen)
    eng.generate(batch, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    if tp > 1:
        eng.runtime.step_timings()  # forget the warm-up's
    prof = cProfile.Profile() if profile else None
    timed = _timed(eng, batch, SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True),
                   tp, prof)
    if prof is not None:
        timed["engine_profile"] = top_functions(pstats.Stats(prof), timed["decode_steps"] or 1)
    out = timed | {"tokens_per_s": round(n * new / timed["seconds"], 1)}
    if tp > 1:
        out["worker0"] = _worker_medians(eng.runtime.step_timings())
        out["wire_totals"] = dict(eng.runtime.wire.totals)
        out["decode_steps_on"] = eng.engine_info()["decode steps"]
        out["allreduce"] = eng.runtime.model_info["allreduce"] | {
            "line": eng.engine_info()["all-reduce"]}
    return out


def _timed(eng: LLMEngine, batch: list[list[int]], params: SamplingParams, tp: int,
           prof: cProfile.Profile | None = None) -> dict[str, Any]:
    ids = [eng.add_request(p, params) for p in batch]
    done: dict[int, tuple[int, ...]] = {}
    steps, hosts, sent = [], [], []
    t0 = time.perf_counter()
    while len(done) < len(ids):
        waited = eng.runtime.reply_wait_s if tp > 1 else 0.0
        s0 = time.perf_counter()
        if prof is not None:
            prof.enable()
        res = eng.step()
        if prof is not None:
            prof.disable()
        dt = time.perf_counter() - s0
        if res.num_decodes and not res.num_prefills:
            steps.append(dt)
            if tp > 1:
                hosts.append(dt - (eng.runtime.reply_wait_s - waited))
                sent.append(eng.runtime.wire.message_bytes)
        for o in res.finished:
            done[o.request_id] = o.outputs[0].token_ids
    seconds = time.perf_counter() - t0
    out = {"seconds": round(seconds, 4), "decode_steps": len(steps),
           "median_decode_step_ms": _median_ms(steps),
           "mean_decode_step_ms": round(1e3 * statistics.fmean(steps), 4) if steps else None,
           "outputs": [list(done[i]) for i in ids]}
    if tp > 1:
        out["median_engine_host_ms"] = _median_ms(hosts)
        out["message_bytes_per_decode_step"] = {"median": statistics.median(sent),
                                                "max": max(sent)} if sent else None
    return out


def _worker_medians(t: dict[str, Any]) -> dict[str, Any]:
    return {"device_steps_timed": t["steps"],
            "median_host_to_launch_ms": _med(t["host_to_launch_ms"]),
            "median_graph_gpu_ms": _med(t["graph_gpu_ms"]),
            "median_whole_ms": _med(t["whole_ms"]),
            "device_step_host_us": t.get("device_step_host")}


def _med(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 4) if xs else None


def _replay_ms(eng: LLMEngine, n: int, reps: int = 20) -> float | None:
    """A one-process engine's decode graph for n sequences, replayed: its GPU time (ms). The
    buffers still hold the run's last step, whose sequences are gone: it rewrites free slots."""
    g = eng.runtime.runner.graphs
    key = (g.bucket(n), 1)
    if key not in g.graphs:
        return None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g.graphs[key].replay()
    start.record()
    for _ in range(reps):
        g.graphs[key].replay()
    end.record()
    end.synchronize()
    return round(start.elapsed_time(end) / reps, 4)


def _held(eng: LLMEngine, tp: int, device: str) -> list[dict[str, Any]]:
    info = eng.engine_info()
    if tp > 1:
        per = [{"weight_bytes": info["weight bytes per rank"], "kv_pool_bytes": kv}
               for kv in info["kv_bytes_per_rank"]]
        per[0]["allocated_bytes"] = info["device bytes allocated on rank 0 (at start)"]
        return per
    weights = sum(p.numel() * p.element_size() for p in eng.runtime.loaded.model.parameters())
    held = {"weight_bytes": weights, "kv_pool_bytes": info["kv_bytes_per_rank"][0]}
    if device == "cuda":
        held["allocated_bytes"] = torch.cuda.memory_allocated()
    return [held]


def compare(a: list, b: list) -> dict[str, Any]:
    same = sum(x == y for x, y in zip(a, b, strict=True))
    first = [next((i for i, (p, q) in enumerate(zip(x, y, strict=True)) if p != q), None)
             for x, y in zip(a, b, strict=True)]
    return {"identical": same, "of": len(a),
            "first_difference_at": [f for f in first if f is not None][:16]}


def drop_loaded_models() -> None:
    """Let go of the models this process loaded (TP = 1 runs), before workers load theirs."""
    from engine.runtime import models

    models._LOADED.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---- the parts of issue 43's table ---------------------------------------------------------------

def model_folder(name: str, smoke: bool, root: str) -> str:
    """The random model of a part, written once: TinyLlama-1.1B's shape ("small") or
    Llama-3-8B's ("big"), bf16, drawn on the GPU; the CPU smoke's two-layer model instead."""
    if smoke:
        return str(save_random_llama(Path(root) / "llama-kv2", TINY_KV2))
    shape, tie = (LLAMA_1B, True) if name == "small" else (LLAMA_8B, False)
    return str(save_random_llama(Path(root) / f"llama-{name}", shape, dtype=torch.bfloat16,
                                 device="cuda", tie=tie))


# (engine, tensor-parallel size, graphs, PAGEDLAB_TP_ALLREDUCE, modes measured on that engine:
# (result name, async scheduling)). TP = 1 runs first (then unloaded); a TP engine starts async,
# and the idle engine is switched to sync for its second batch: one start-up for both modes
# (the equality part's second TP = 2 start-up ran its part out of time on two H100s).
RUNS: dict[str, list[tuple[str, int, bool, str, Modes]]] = {
    "equal": [("tp1", 1, True, "auto", (("tp1", False),)),
              ("tp2", 2, True, "auto", (("tp2_async", True), ("tp2_sync", False)))],
    "small": [("tp1", 1, True, "auto", (("tp1_sync", False), ("tp1_async", True),
                                         ("tp1_sync_profile", False))),
              ("tp2", 2, True, "auto", (("tp2_async", True), ("tp2_sync", False),
                                        ("tp2_sync_profile", False)))],
    "big": [("tp1", 1, True, "auto", (("tp1_async", True), ("tp1_sync", False))),
            ("tp2", 2, True, "auto", (("tp2_async", True), ("tp2_sync", False)))],
    # run 2's and run 1's all-reduces against today's (not in the default run: measured)
    "small_allreduce": [
        ("tp1", 1, True, "auto", (("tp1_sync", False), ("tp1_async", True))),
        ("tp2_unfused", 2, True, "auto-unfused",
         (("tp2_unfused_async", True), ("tp2_unfused_sync", False))),
        ("tp2_nccl", 2, True, "nccl", (("tp2_nccl_async", True), ("tp2_nccl_sync", False)))],
}
SPECS = {"small": (32, 128, 128), "small_allreduce": (32, 128, 128), "equal": (8, 64, 32),
         "big": (64, 256, 64)}


def part(name: str, smoke: bool, out_path: str, model_dir: str, deadline: float) -> None:
    """Run one part's engines in turn, each guarded; the JSON is rewritten after each run."""
    device = "cpu" if smoke else "cuda"
    dtype = "float32" if smoke or name == "equal" else "bfloat16"
    spec = (4, 16, 8) if smoke else SPECS[name]
    env = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
    out: dict[str, Any] = {"part": name, "device": device, "dtype": dtype, "spec": spec,
                           "gpus": torch.cuda.device_count(), "torch": torch.__version__,
                           "env": {k: os.environ[k] for k in env}, "runs": {}}
    if device == "cuda":
        out["device_name"] = torch.cuda.get_device_name()
    t0 = time.perf_counter()
    folder = model_folder("big" if name == "big" else "small", smoke, model_dir)
    out["model"] = {"folder": folder, "build_or_find_s": round(time.perf_counter() - t0, 1),
                    "config": json.loads((Path(folder) / "config.json").read_text())}
    _write(out, out_path)
    state: dict[str, Any] = {"longest": 0.0, "level": 0, "failures": []}
    unloaded = False
    for engine, tp, graphs, allreduce, modes in RUNS[name]:
        if tp > 1 and not unloaded:
            drop_loaded_models()
            unloaded = True
        for level, (g, ar) in _attempts(tp, graphs, allreduce, state["level"]):
            state["level"] = level
            args = (folder, tp, dtype, device, spec, g, ar, modes)
            if _guarded_run(out, out_path, engine, args, state, deadline) != "failed":
                break


def _attempts(tp: int, graphs: bool, allreduce: str, level: int) -> list[tuple[int, tuple]]:
    """What to try for an engine, in order, with its level: as asked; then (TP) NCCL in the
    graphs; then eager workers. A failure sends the rest of the part to the next level."""
    if tp == 1:
        return [(0, (graphs, allreduce))]
    ladder = [(graphs, allreduce), (graphs, "nccl"), (False, "nccl")]
    out: list[tuple[int, tuple]] = []
    for i, c in enumerate(ladder[level:], start=level):
        if all(c != tried for _, tried in out):
            out.append((i, c))
    return out


def _guarded_run(out: dict[str, Any], path: str, engine: str, args: tuple,
                 state: dict[str, Any], deadline: float) -> str:
    """One engine's runs into out["runs"], never raising: "ok", "skipped", "partial" (failed
    after a run was recorded) or "failed"."""
    names = [m for m, _ in args[-1]]
    left = deadline - time.time()
    if left < 1.3 * state["longest"]:
        for m in names:
            out["runs"][m] = {"skipped": f"{left:.0f} s left, the longest engine took "
                                         f"{state['longest']:.0f} s"}
        _write(out, path)
        return "skipped"
    extra = {"allreduce_asked": args[6], "after_failures": list(state["failures"])}
    done: list[str] = []

    def record(m: str, result: dict[str, Any]) -> None:
        out["runs"][m] = result | extra
        done.append(m)
        _write(out, path)

    r0 = time.perf_counter()
    try:
        run(*args, record=record, deadline=deadline)
        return "ok"
    except Exception as err:  # noqa: BLE001 - fail soft: the other runs' numbers stay
        traceback.print_exc()
        error = f"{type(err).__name__}: {str(err)[:2000]}"
        state["failures"].append(f"{engine} (graphs={args[5]}, all-reduce={args[6]}): {error}")
        for m in names:
            if m not in done:
                out["runs"][m] = {"error": error} | extra
        _write(out, path)
        return "partial" if done else "failed"  # a run that measured something is not redone
    finally:
        state["longest"] = max(state["longest"], time.perf_counter() - r0)


def _write(out: dict[str, Any], path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1))
    tmp.replace(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=sorted(RUNS), required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU, gloo, a two-layer model")
    ap.add_argument("--model-dir", default=None, help="where the random models are written")
    ap.add_argument("--deadline", type=float, default=None, help="epoch seconds: skip runs after")
    args = ap.parse_args()
    if not args.smoke and torch.cuda.device_count() < 2:
        sys.exit(f"needs 2 GPUs, torch sees {torch.cuda.device_count()}; --smoke runs on a CPU")
    root = args.model_dir or str(cache_root() / "random-llama-tp")
    part(args.part, args.smoke, args.json, root, args.deadline or time.time() + 3600)


if __name__ == "__main__":
    main()
