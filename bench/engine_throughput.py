"""Engine throughput on a GPU: greedy decode of the default model against HF transformers.

64 requests of 128 prompt tokens and 256 new tokens each, through
- PagedLab's engine (`LLMEngine.step` until done: continuous batching, paged KV, Triton kernels,
  decode steps replayed as CUDA graphs), and the same engine with the graphs switched off,
- HF `generate` on the same batch (dynamic cache, sdpa),
- HF's own continuous batching (`generate_batch`, paged|sdpa), where this transformers has it.

Reports output tokens/s, the engine's mean decode step (wall time, host work included) and the
GPU time of one replayed decode graph, both against a roofline (weight bytes + KV bytes read per
step, over the device copy bandwidth measured in the same run), where a step's host time goes,
and whether the outputs equal greedy HF's: in bf16 (the timed runs) and again in float32, with
HF's top-2 logit gap where a sequence parts from HF's.

    python bench/engine_throughput.py --out bench/results/engine_throughput.json
    python bench/engine_throughput.py --smoke --out /tmp/engine.json   # CPU check of the script
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from copy_bandwidth import copy_bandwidth  # noqa: E402 (bench/, beside this file)

from engine import EngineConfig, LLMEngine, SamplingParams, step_run  # noqa: E402
from engine.runtime.models import load_model  # noqa: E402

TEXT = ("PagedAttention stores the KV cache in fixed-size blocks that need not be contiguous, "
        "like pages of virtual memory; a block table maps each sequence's logical blocks to "
        "physical ones, so memory is allocated on demand and shared by copy-on-write. ") * 20


def prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    ids = tokenizer.encode(TEXT)
    return [ids[i * 3: i * 3 + length] for i in range(n)]


DEVICE = "cuda"  # --smoke: "cpu"
PROFILE_STEPS = 32  # --smoke: 2 (the profile checks the script, not the CPU's numbers)
WARM_TOKENS = 8  # --smoke: 2 (a CPU compiles nothing: the warm-up only runs the path once)


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable):
    sync()
    t = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t


class HostTimer:
    """Wall time spent inside a method, summed over calls (wraps it on one instance)."""

    def __init__(self, obj, name: str) -> None:
        self.total, self.calls = 0.0, 0
        original = getattr(obj, name)

        def wrapped(*a, **k):
            t = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                self.total += time.perf_counter() - t
                self.calls += 1
        setattr(obj, name, wrapped)


def make_engine(dtype: str, blocks: int, graphs: bool) -> LLMEngine:
    eng = LLMEngine(EngineConfig(model="default", device=DEVICE, dtype=dtype, block_size=16,
                                 num_gpu_blocks=blocks))
    if not graphs:
        eng.runtime.runner.graphs.use_graphs = eng.runtime.runner.graphs.pad = False
    return eng


def profile_decode_steps(eng: LLMEngine, batch: list[list[int]], path: str, steps: int) -> None:
    """cProfile of `steps` decode steps of the same batch (after the timed run: it slows them)."""
    import cProfile
    import io
    import pstats

    for p in batch:
        eng.add_request(p, SamplingParams(max_tokens=steps + 8, ignore_eos=True))
    while eng.scheduler.waiting:
        eng.step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        eng.step()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(40)
    with open(path, "w") as f:
        f.write(out.getvalue())
    while eng.scheduler.has_work():
        eng.step()


def run_engine(dtype: str, batch: list[list[int]], new: int, graphs: bool,
               profile_path: str | None = None) -> dict:
    n = len(batch)
    blocks = n * -(-(len(batch[0]) + new) // 16) + 64
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    eng = make_engine(dtype, blocks, graphs)
    eng.generate(batch[:4], SamplingParams(max_tokens=WARM_TOKENS, ignore_eos=True))  # compile, warm up
    runner = eng.runtime.runner
    if graphs:
        runner.graphs.capture(tuple(b for b in runner.graphs.sizes if b <= n))
    timers = {name: HostTimer(obj, attr) for name, obj, attr in [
        ("schedule", eng.scheduler, "schedule"),
        ("model: inputs + launch", eng.runtime, "execute"),
        ("sample (waits for the GPU)", step_run, "pick"),
        ("postprocess", eng._post, "land"),
    ]}
    steps = []
    ids = [eng.add_request(p, params) for p in batch]
    done: dict[int, list[int]] = {}
    sync()
    t0 = time.perf_counter()
    while eng.scheduler.has_work():
        before = {k: t.total for k, t in timers.items()}
        ts = time.perf_counter()
        r = eng.step()
        parts = {k: t.total - before[k] for k, t in timers.items()}
        steps.append((time.perf_counter() - ts, r.num_prefills, r.num_decodes, parts))
        done.update({o.request_id: list(o.outputs[0].token_ids) for o in r.finished})
    sync()
    seconds = time.perf_counter() - t0
    decodes = [(s, parts) for s, p, d, parts in steps if p == 0 and d > 0]
    decode_steps = [s for s, _ in decodes]
    breakdown = {k: 1e3 * statistics.mean(parts[k] for _, parts in decodes) for k in timers}
    breakdown["rest of the step"] = 1e3 * statistics.mean(decode_steps) - sum(breakdown.values())
    result = {
        "cuda_graphs": graphs, "seconds": seconds, "tokens_per_s": n * new / seconds,
        "steps": len(steps), "decode_steps": len(decode_steps),
        "prefill_steps_ms": [round(1e3 * s, 2) for s, p, _, _ in steps if p > 0],
        "mean_decode_step_ms": 1e3 * statistics.mean(decode_steps),
        "median_decode_step_ms": 1e3 * statistics.median(decode_steps),
        # where a decode step's wall time goes; "postprocess" waits for the GPU (the sampled
        # tokens are its first read of the step's results)
        "decode_step_breakdown_ms": breakdown,
        "graph_replays": runner.graphs.num_replays,
        "outputs": [done[i] for i in ids],
    }
    if profile_path:
        profile_decode_steps(eng, batch, profile_path, PROFILE_STEPS)
    if graphs and (n, 1) in runner.graphs.graphs:
        graph = runner.graphs.graphs[(n, 1)]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(50):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        # The replays rewrite the last step's K/V with the same values: the engine is done anyway.
        result["graph_replay_gpu_ms"] = statistics.median(times)
    del eng, runner, timers  # the timers' wrappers hold the engine: free its pool now
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return result


def hf_generate(model, batch: list[list[int]], new: int) -> tuple[list[list[int]], float]:
    x = torch.tensor(batch, device=DEVICE)
    model.generate(x[:4], do_sample=False, max_new_tokens=WARM_TOKENS, eos_token_id=None, pad_token_id=0)
    out, seconds = timed(lambda: model.generate(x, do_sample=False, max_new_tokens=new,
                                                eos_token_id=None, pad_token_id=0))
    return out[:, x.shape[1]:].tolist(), seconds


def hf_generate_batch(model, batch: list[list[int]], new: int) -> tuple[list[list[int]], float]:
    from transformers import GenerationConfig

    cfg = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    kw = {}
    if DEVICE == "cpu":  # HF sizes its paged cache from free memory: on a CPU, most of the RAM
        try:
            from transformers.generation.configuration_utils import ContinuousBatchingConfig

            kw["continuous_batching_config"] = ContinuousBatchingConfig(num_blocks=256, max_batch_tokens=512)
        except ImportError:  # an older transformers: its own sizing
            pass
    # outside inference_mode: its cache is updated in place by plain autograd-free ops
    with torch.inference_mode(False), torch.no_grad():
        model.generate_batch(inputs=batch[:4], generation_config=cfg, **kw)
        outs, seconds = timed(lambda: model.generate_batch(inputs=batch, generation_config=cfg, **kw))
    by_request = sorted(outs.values(), key=lambda o: int(str(o.request_id).split("_")[-1]))
    tokens = [list(o.generated_tokens) for o in by_request]
    produced = sum(map(len, tokens))
    if produced != len(batch) * new:  # a failed request still returns: count what came out
        raise RuntimeError(f"generate_batch produced {produced} of {len(batch) * new} tokens")
    return tokens, seconds


@torch.inference_mode()
def compare(model, batch: list[list[int]], ours: list[list[int]], theirs: list[list[int]]) -> dict:
    """How many outputs are identical; where one parts, HF's top-2 logit gap at that token."""
    parted = []
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a != b:
            k = next(j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
            logits = model(torch.tensor([batch[i] + b[:k]], device=DEVICE)).logits[0, -1].float()
            top = torch.topk(logits, 2).values.tolist()
            parted.append({"request": i, "at_token": k, "hf_top2_gap": top[0] - top[1]})
    return {"identical": len(ours) - len(parted), "of": len(ours), "parted": parted}


def stage(result: dict, name: str, fn: Callable[[], dict]) -> None:
    """Run one part; a failure is recorded and the others still run."""
    try:
        result[name] = fn()
    except Exception as err:
        traceback.print_exc()
        result[name] = {"error": f"{type(err).__name__}: {err}"[:400]}
    shown = {k: v for k, v in result[name].items() if k != "outputs"}
    print(name, json.dumps(shown)[:1500], flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/engine_throughput.json")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--smoke", action="store_true",
                    help="CPU, float32, 2 x (16 + 4), no engine_no_graphs or hf_generate_batch "
                         "stage: checks the script")
    args = ap.parse_args()
    global DEVICE, PROFILE_STEPS, WARM_TOKENS
    if args.smoke:
        # 2 sequences still batch; 16 + 4 tokens still cross a block (16) and decode 3 steps
        DEVICE, args.requests, args.prompt_len, args.new_tokens = "cpu", 2, 16, 4
        PROFILE_STEPS = WARM_TOKENS = 2
    elif not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --smoke for the CPU check of this script")
    half = "float32" if args.smoke else "bfloat16"
    n, plen, new = args.requests, args.prompt_len, args.new_tokens
    import transformers
    import triton

    lm = load_model("default", DEVICE, half)
    batch = prompts(lm.tokenizer, n, plen)
    assert all(len(p) == plen for p in batch)
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else f"cpu x{os.cpu_count()}"
    result: dict = {"device": name, "dtype": half, "torch": torch.__version__,
                    "triton": triton.__version__, "transformers": transformers.__version__,
                    "python": platform.python_version(), "cpu": platform.processor() or
                    platform.machine(), "requests": n, "prompt_len": plen, "new_tokens": new}
    bw = copy_bandwidth(DEVICE)
    result["copy_bandwidth_GBps"] = bw / 1e9
    weight_bytes = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    kv_per_token = 2 * lm.num_layers * lm.num_kv_heads * lm.head_dim * lm.dtype.itemsize
    mean_ctx = plen + new / 2
    roofline_ms = 1e3 * (weight_bytes + n * mean_ctx * kv_per_token) / bw
    result["roofline_decode_step_ms"] = roofline_ms

    profile = os.path.splitext(args.out)[0] + "_profile.txt"
    stage(result, "engine", lambda: run_engine(half, batch, new, graphs=True, profile_path=profile))
    if args.smoke:  # a CPU has no CUDA graphs: "engine" already ran this very code
        result["engine_no_graphs"] = {"skipped": "--smoke: no CUDA graphs on a CPU"}
    else:
        stage(result, "engine_no_graphs", lambda: run_engine(half, batch, new, graphs=False))
    for key in ("engine", "engine_no_graphs"):
        r = result[key]
        if "mean_decode_step_ms" in r:
            r["step_over_roofline"] = r["mean_decode_step_ms"] / roofline_ms
        if "graph_replay_gpu_ms" in r:
            r["graph_gpu_over_roofline"] = r["graph_replay_gpu_ms"] / roofline_ms

    attn = lm.model.config._attn_implementation
    ours = result["engine"].get("outputs")
    try:
        lm.model.set_attn_implementation("sdpa")

        hf_outputs: dict[str, list[list[int]]] = {}

        def generate() -> dict:
            out, s = hf_generate(lm.model, batch, new)
            hf_outputs["generate"] = out
            r = {"seconds": s, "tokens_per_s": n * new / s}
            if ours:
                r["engine_vs_this"] = compare(lm.model, batch, ours, out)
            return r

        stage(result, "hf_generate", generate)

        def generate_batch() -> dict:
            lm.model.set_attn_implementation("paged|sdpa")
            out, s = hf_generate_batch(lm.model, batch, new)
            lm.model.set_attn_implementation("sdpa")
            r = {"seconds": s, "tokens_per_s": n * new / s}
            if ours:
                r["engine_vs_this"] = compare(lm.model, batch, ours, out)
            if "generate" in hf_outputs:  # HF's two paths against each other, same bf16 model
                r["hf_generate_vs_this"] = compare(lm.model, batch, hf_outputs["generate"], out)
            return r

        if args.smoke:  # as bench/serving_suite.py's smoke: on a CPU it is HF's own slow path
            result["hf_generate_batch"] = {"skipped": "--smoke: HF's continuous batching on a CPU"}
        else:
            stage(result, "hf_generate_batch", generate_batch)
    finally:
        lm.model.set_attn_implementation(attn)

    def float32() -> dict:
        if half == "float32" and "engine_vs_this" in result["hf_generate"]:
            # --smoke: the timed runs were float32 already, on these weights: the same runs again
            # would compare the same tokens
            return {"engine_vs_hf_generate": result["hf_generate"]["engine_vs_this"],
                    "engine_tokens_per_s": result["engine"]["tokens_per_s"]}
        lm32 = load_model("default", DEVICE, "float32")
        eng = run_engine("float32", batch, new, graphs=True)
        old = lm32.model.config._attn_implementation
        lm32.model.set_attn_implementation("sdpa")
        try:
            hf, _ = hf_generate(lm32.model, batch, new)
            return {"engine_vs_hf_generate": compare(lm32.model, batch, eng["outputs"], hf),
                    "engine_tokens_per_s": eng["tokens_per_s"]}
        finally:
            lm32.model.set_attn_implementation(old)

    stage(result, "float32_equivalence", float32)
    for k in ("hf_generate", "hf_generate_batch"):
        if "tokens_per_s" in result.get(k, {}) and "tokens_per_s" in result["engine"]:
            result[f"engine_over_{k}"] = result["engine"]["tokens_per_s"] / result[k]["tokens_per_s"]
    for key in ("engine", "engine_no_graphs"):
        result[key].pop("outputs", None)
    print(json.dumps(result, indent=1))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    png = os.path.splitext(args.out)[0] + ".png"
    plot(result, png)


def plot(result: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib not importable: skipping the plot {path}")
        return
    names = [("engine", "PagedLab (CUDA graphs)"), ("engine_no_graphs", "PagedLab (no graphs)"),
             ("hf_generate", "HF generate"), ("hf_generate_batch", "HF generate_batch")]
    shown = [(label, result[k]["tokens_per_s"]) for k, label in names
             if "tokens_per_s" in result.get(k, {})]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.barh([s[0] for s in shown][::-1], [s[1] for s in shown][::-1], color="#4c72b0")
    for i, (_, v) in enumerate(shown[::-1]):
        ax.text(v, i, f" {v:,.0f}", va="center")
    ax.set_xlabel("output tokens / s")
    ax.set_title(f"{result['device']}: {result['requests']} x ({result['prompt_len']} + "
                 f"{result['new_tokens']}) greedy, bf16", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
