"""Serving benchmark suite: the engine on workloads a server sees, against HF in the same run.

Workloads (prompt and output lengths from a seeded synthetic ShareGPT-like distribution:
log-normal, prompts median ~130 and mean ~170 tokens, outputs median ~100, clipped; prompts are
random token ids, so no two workloads share a prefix unless they mean to):

- `ragged_greedy`, `ragged_sampled` (temperature 0.8, top-p 0.95): 256 requests at once;
- `parallel_n8`: 32 requests x n = 8 samples (256 sequences), sampled and the same batch greedy:
  the sampled decode step over the greedy one;
- `beam4`: 16 requests x beam width 4;
- `shared_system_prompt`: 256 requests behind one 256-token system prompt (prefix caching);
- `long_context`: one sequence with an 8,000-token prompt against one with 512;
- `long_prompt_among_decodes`: an 8,000-token prompt arrives while 64 sequences decode, with
  chunked prefill and without: its time to first token, and how long their steps get;
- `concurrency`: 8, 64, 256 and 512 sequences of 128 + 128 tokens: the decode step against its
  roofline (weight bytes + KV bytes over the copy bandwidth measured in the same run);
- `cold_start`: engine start-up (kernel compilation and graph capture included), then the first
  batch's decode step against the same batch run again.

Each of the ragged, n = 8 and beam workloads also runs through HF `generate` (one padded batch)
and HF `generate_batch` (HF's continuous batching), in the same process on the same weights.
Neither HF API takes a length per request: HF generates up to the longest output for every
request, and tokens/s counts only the tokens the workload asked for (what a user gets).

    python bench/serving_suite.py --model PATH --out bench/results/serving_suite.json
    python bench/serving_suite.py --smoke --out /tmp/suite.json   # CPU, tiny-random, seconds
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
import traceback
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from copy_bandwidth import copy_bandwidth  # noqa: E402 (bench/, beside this file)

from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from engine.runtime.models import load_model  # noqa: E402

DEVICE = "cuda"
ASYNC = True  # async scheduling, as a server would run (--sync: off; `concurrency` runs both)
NO_HF = False  # --no-hf: the engine alone (a quick re-measure; no baseline ratios)


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def sharegpt_like(n: int, seed: int, vocab: int, scale: float = 1.0, max_prompt: int = 1024,
                  max_out: int = 384) -> list[tuple[list[int], int]]:
    """n (prompt token ids, output length) pairs: log-normal lengths (prompt mu 4.9 sigma 0.75,
    output mu 4.6 sigma 0.6, as ShareGPT's are roughly shaped), `scale` shrinks them."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        plen = max(4, min(max_prompt, int(scale * rng.lognormvariate(4.9, 0.75))))
        olen = max(4, min(max_out, int(scale * rng.lognormvariate(4.6, 0.6))))
        out.append(([rng.randrange(10, vocab) for _ in range(plen)], olen))
    return out


class Bench:
    def __init__(self, model: str, dtype: str, smoke: bool) -> None:
        self.model, self.dtype, self.smoke = model, dtype, smoke
        self.lm = load_model(model, DEVICE, dtype)
        self.vocab = int(self.lm.vocab_size)
        self.bw = copy_bandwidth(DEVICE)
        lm = self.lm
        self.weight_bytes = sum(p.numel() * p.element_size() for p in lm.model.parameters())
        self.kv_per_token = 2 * lm.num_layers * lm.num_kv_heads * lm.head_dim * lm.dtype.itemsize

    def roofline_ms(self, contexts: list[int]) -> float:
        return 1e3 * (self.weight_bytes + sum(contexts) * self.kv_per_token) / self.bw

    def engine(self, max_num_seqs: int = 256, blocks: int | None = None, **kw) -> tuple[LLMEngine, float]:
        t = time.perf_counter()
        kw.setdefault("async_scheduling", ASYNC)
        eng = LLMEngine(EngineConfig(model=self.model, device=DEVICE, dtype=self.dtype,
                                     block_size=16, num_gpu_blocks=blocks,
                                     max_num_seqs=max_num_seqs, **kw))
        sync()
        return eng, time.perf_counter() - t

    def run_engine(self, eng: LLMEngine, work: list[tuple[list[int], SamplingParams]]) -> dict:
        """Every request at once; wall time to the last token, each step's time and kind."""
        ids = [eng.add_request(p, sp) for p, sp in work]
        steps: list[tuple[float, int, int, int]] = []
        done: dict[int, object] = {}
        sync()
        t0 = time.perf_counter()
        while eng.has_pending_work():
            ts = time.perf_counter()
            r = eng.step()
            steps.append((time.perf_counter() - ts, r.num_prefills, r.num_decodes,
                          r.num_batched_tokens))
            for o in r.finished:
                done[o.request_id] = o
        sync()
        seconds = time.perf_counter() - t0
        tokens = sum(len(c.token_ids) for i in ids for c in done[i].outputs)
        decodes = [s for s, p, d, _ in steps if p == 0 and d > 0]
        full = [s for s, p, d, _ in steps if p == 0 and d == max(x[2] for x in steps)]
        eng.check_invariants()
        return {
            "seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
            "steps": len(steps), "prefill_steps": len(steps) - len(decodes),
            "mean_decode_step_ms": 1e3 * statistics.mean(decodes) if decodes else None,
            "median_decode_step_ms": 1e3 * statistics.median(decodes) if decodes else None,
            # steps where every sequence of the workload decodes: the step at full concurrency
            "median_full_batch_decode_ms": 1e3 * statistics.median(full) if full else None,
            "max_sequences_in_a_step": max(x[2] for x in steps),
            "outputs": [[list(c.token_ids) for c in done[i].outputs] for i in ids],
        }

    # ---- HF ------------------------------------------------------------------------------------

    def hf_generate(self, prompts: list[list[int]], max_new: int, **kw) -> float:
        """One left-padded batch through HF generate; seconds."""
        model = self.lm.model
        width = max(map(len, prompts))
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(DEVICE), mask.to(DEVICE)
        with torch.inference_mode():
            # warm-up at the full batch's shapes (its prefill and a step): a first call at a
            # new shape pays for kernel selection and allocator growth, not for generating
            model.generate(ids, attention_mask=mask, max_new_tokens=2, eos_token_id=None,
                           pad_token_id=0, **kw)
            sync()
            t = time.perf_counter()
            model.generate(ids, attention_mask=mask, max_new_tokens=max_new, eos_token_id=None,
                           pad_token_id=0, **kw)
            sync()
        return time.perf_counter() - t

    def hf_generate_batch(self, prompts: list[list[int]], max_new: int, **kw) -> float:
        from transformers import GenerationConfig

        cfg = GenerationConfig(max_new_tokens=max_new, eos_token_id=None, pad_token_id=0, **kw)
        model = self.lm.model
        old = model.config._attn_implementation
        model.set_attn_implementation("paged|sdpa")
        try:
            with torch.inference_mode(False), torch.no_grad():
                model.generate_batch(inputs=prompts[:2], generation_config=cfg)
                sync()
                t = time.perf_counter()
                outs = model.generate_batch(inputs=prompts, generation_config=cfg)
                sync()
            seconds = time.perf_counter() - t
        finally:
            model.set_attn_implementation(old)
        made = sum(len(o.generated_tokens) for o in outs.values())
        if made < len(prompts) * max_new * (kw.get("num_return_sequences") or 1):
            raise RuntimeError(f"generate_batch made {made} tokens, fewer than asked")
        return seconds

    def hf_run(self, result: dict, name: str, fn: Callable[..., float], prompts: list[list[int]],
               max_new: int, tokens: int, **kw) -> None:
        """One HF baseline; tokens/s over the workload's tokens; a failure is recorded."""
        try:
            s = fn(prompts, max_new, **kw)
            result[name] = {"seconds": s, "tokens_per_s": tokens / s}
            result[f"engine_over_{name}"] = result["engine"]["tokens_per_s"] / (tokens / s)
        except Exception as err:  # recorded, the suite goes on
            traceback.print_exc()
            result[name] = {"error": f"{type(err).__name__}: {err}"[:300]}

    def with_hf(self, result: dict, prompts: list[list[int]], max_new: int, tokens: int,
                batch_api: bool = True, **kw) -> None:
        """HF generate and generate_batch on the same prompts, tokens/s over the same tokens."""
        if NO_HF:
            return
        model = self.lm.model
        old = model.config._attn_implementation
        model.set_attn_implementation("sdpa")
        try:
            self.hf_run(result, "hf_generate", self.hf_generate, prompts, max_new, tokens, **kw)
            # smoke: no generate_batch (on a CPU it takes minutes even for a few tiny requests)
            if batch_api and not self.smoke:
                self.hf_run(result, "hf_generate_batch", self.hf_generate_batch, prompts, max_new,
                            tokens, **kw)
        finally:
            model.set_attn_implementation(old)


def _replay_gpu_ms(eng: LLMEngine, n: int) -> float | None:
    """GPU time of one replay of the decode graph of n sequences (CUDA events, median of 20):
    the step's device part, to set against its wall time."""
    graphs = eng.runtime.runner.graphs
    if DEVICE != "cuda" or (graphs.bucket(n), 1) not in graphs.graphs:
        return None
    graph = graphs.graphs[(graphs.bucket(n), 1)]
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()  # rewrites the last step's K/V slots with the same values
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def ragged(b: Bench, eng: LLMEngine, n: int, seed: int, sampled: bool, scale: float) -> dict:
    work = sharegpt_like(n, seed, b.vocab, scale)
    kw = dict(temperature=0.8, top_p=0.95) if sampled else {}
    runs = [(p, SamplingParams(max_tokens=o, ignore_eos=True, seed=i, **kw))
            for i, (p, o) in enumerate(work)]
    res = {"requests": n, "sampling": kw or "greedy",
           "mean_prompt_len": statistics.mean(len(p) for p, _ in work),
           "mean_output_len": statistics.mean(o for _, o in work),
           "max_output_len": max(o for _, o in work)}
    res["engine"] = b.run_engine(eng, runs)
    res["engine"].pop("outputs")
    hf_kw = dict(do_sample=True, temperature=0.8, top_p=0.95, top_k=0) if sampled else \
        dict(do_sample=False)
    b.with_hf(res, [p for p, _ in work], max(o for _, o in work), res["engine"]["tokens"], **hf_kw)
    return res


def parallel_n8(b: Bench, eng: LLMEngine, requests: int, new: int, scale: float) -> dict:
    work = sharegpt_like(requests, 11, b.vocab, scale)
    res: dict = {"requests": requests, "n": 8, "new_tokens": new}
    for name, kw in (("greedy", {}), ("sampled", dict(temperature=0.8, top_p=0.95))):
        runs = [(p, SamplingParams(max_tokens=new, n=8, ignore_eos=True, seed=i, **kw))
                for i, (p, _) in enumerate(work)]
        r = b.run_engine(eng, runs)
        r.pop("outputs")
        res[name] = r
    res["engine"] = res["sampled"]
    g, s = res["greedy"]["median_full_batch_decode_ms"], res["sampled"]["median_full_batch_decode_ms"]
    res["sampled_over_greedy_step"] = s / g if g and s else None
    prompts = [p for p, _ in work]
    b.with_hf(res, prompts, new, res["sampled"]["tokens"], batch_api=False, do_sample=True,
              temperature=0.8, top_p=0.95, top_k=0, num_return_sequences=8)
    if not b.smoke and not NO_HF:  # generate_batch has no n: each prompt asked 8 times, as a user would
        b.hf_run(res, "hf_generate_batch", b.hf_generate_batch, [p for p in prompts for _ in range(8)],
                 new, res["sampled"]["tokens"], do_sample=True, temperature=0.8, top_p=0.95, top_k=0)
    return res


def beam4(b: Bench, eng: LLMEngine, requests: int, new: int, scale: float) -> dict:
    work = sharegpt_like(requests, 12, b.vocab, scale, max_prompt=256)
    runs = [(p, SamplingParams(max_tokens=new, beam_width=4, ignore_eos=True)) for p, _ in work]
    res: dict = {"requests": requests, "beam_width": 4, "new_tokens": new}
    res["engine"] = b.run_engine(eng, runs)
    # tokens/s counts the generated beams' tokens (4 per request per step), as HF makes them
    res["engine"].pop("outputs")
    b.with_hf(res, [p for p, _ in work], new, res["engine"]["tokens"], batch_api=False,
              do_sample=False, num_beams=4, num_return_sequences=4, length_penalty=1.0,
              early_stopping=False)
    return res


def shared_system_prompt(b: Bench, eng: LLMEngine, n: int, system: int, new: int,
                         scale: float) -> dict:
    rng = random.Random(13)
    sys_ids = [rng.randrange(10, b.vocab) for _ in range(system)]
    users = [[rng.randrange(10, b.vocab) for _ in range(rng.randint(max(2, int(20 * scale)),
                                                                   max(3, int(100 * scale))))]
             for _ in range(n)]
    before = eng.kv.prefix_hit_blocks
    runs = [(sys_ids + u, SamplingParams(max_tokens=new, ignore_eos=True)) for u in users]
    res: dict = {"requests": n, "system_prompt_len": system, "new_tokens": new}
    res["engine"] = b.run_engine(eng, runs)
    res["engine"].pop("outputs")
    res["prefix_hit_blocks"] = eng.kv.prefix_hit_blocks - before
    b.with_hf(res, [sys_ids + u for u in users], new, res["engine"]["tokens"], do_sample=False)
    return res


def long_context(b: Bench, lengths: tuple[int, ...], new: int) -> dict:
    res: dict = {"new_tokens": new}
    for plen in lengths:
        eng, _ = b.engine(max_num_seqs=8, blocks=-(-(plen + new) // 16) + 16)
        prompt = [random.Random(plen).randrange(10, b.vocab) for _ in range(plen)]
        r = b.run_engine(eng, [(prompt, SamplingParams(max_tokens=new, ignore_eos=True))])
        r.pop("outputs")
        r["graph_replays"] = eng.runtime.runner.graphs.num_replays
        r["roofline_ms"] = b.roofline_ms([plen + new // 2])
        res[str(plen)] = r
        del eng
        release()
    lo, hi = (res[str(x)]["median_decode_step_ms"] for x in (min(lengths), max(lengths)))
    res["long_over_short_step"] = hi / lo
    return res


def long_prompt_among_decodes(b: Bench, n: int, plen: int, new: int, long_len: int,
                              budget: int) -> dict:
    """A long prompt arrives while n sequences decode: with chunked prefill it is computed a
    chunk a step beside them; without, it waits until the batch is done and then runs whole.
    Its time to first token, and the running sequences' steps while it is in the engine."""
    res: dict = {"running": n, "prompt_len": plen, "new_tokens": new, "long_prompt_len": long_len,
                 "max_num_batched_tokens": budget}
    rng = random.Random(17)
    prompts = [[rng.randrange(10, b.vocab) for _ in range(plen)] for _ in range(n)]
    long_prompt = [rng.randrange(10, b.vocab) for _ in range(long_len)]
    for chunked in (True, False):
        eng, _ = b.engine(max_num_seqs=n + 1, blocks=n * -(-(plen + new) // 16) + long_len // 16 + 64,
                          max_num_batched_tokens=budget, enable_chunked_prefill=chunked,
                          enable_prefix_caching=False, async_scheduling=False)
        for p in prompts:
            eng.add_request(p, SamplingParams(max_tokens=new, ignore_eos=True))
        for _ in range(8):  # everyone prefilled and decoding
            eng.step()
        sync()
        rid = eng.add_request(long_prompt, SamplingParams(max_tokens=8, ignore_eos=True))
        t0 = time.perf_counter()
        steps: list[float] = []
        decoded = 0
        ttft = None
        while ttft is None and eng.scheduler.has_work():
            ts = time.perf_counter()
            decoded += eng.step().num_decodes
            sync()
            steps.append(1e3 * (time.perf_counter() - ts))
            if eng.groups[rid].prefilled:
                ttft = time.perf_counter() - t0
        res["chunked" if chunked else "whole"] = {
            "long_prompt_ttft_s": ttft, "steps_until_first_token": len(steps),
            "max_step_ms": max(steps), "median_step_ms": statistics.median(steps),
            "tokens_decoded_meanwhile": decoded}
        eng.check_invariants()
        del eng
        release()
    c, w = res["chunked"], res["whole"]
    res["ttft_whole_over_chunked"] = w["long_prompt_ttft_s"] / c["long_prompt_ttft_s"]
    return res


def concurrency(b: Bench, sizes: tuple[int, ...], plen: int, new: int) -> dict:
    """The decode step against its roofline at each size, with async scheduling and without
    (the same requests): the graph's GPU time, and what the host adds around it."""
    res: dict = {"prompt_len": plen, "new_tokens": new}
    for n in sizes:
        rng = random.Random(n)
        runs = [([rng.randrange(10, b.vocab) for _ in range(plen)],
                 SamplingParams(max_tokens=new, ignore_eos=True)) for _ in range(n)]
        for overlap in (True, False):
            eng, _ = b.engine(max_num_seqs=max(n, 8), blocks=n * -(-(plen + new) // 16) + 64,
                              async_scheduling=overlap)
            r = b.run_engine(eng, runs)
            r.pop("outputs")
            r["roofline_ms"] = b.roofline_ms([plen + new // 2] * n)
            r["full_step_over_roofline"] = r["median_full_batch_decode_ms"] / r["roofline_ms"]
            r["graph_replay_gpu_ms"] = _replay_gpu_ms(eng, n)
            if r["graph_replay_gpu_ms"]:
                r["graph_gpu_over_roofline"] = r["graph_replay_gpu_ms"] / r["roofline_ms"]
            res[str(n) if overlap else f"{n}_sync"] = r
            del eng
            release()
    return res


def _cpu_name() -> str:
    """The host's processor: a step that is host work runs at its speed (runs on two machines
    of the same GPU differ by it)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def release() -> None:
    """Give a dropped engine's pool back before the next one sizes its own."""
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def cold_start(b: Bench, n: int, scale: float) -> dict:
    eng, start_s = b.engine(blocks=20_000)
    work = sharegpt_like(n, 21, b.vocab, scale)
    runs = [(p, SamplingParams(max_tokens=o, ignore_eos=True)) for p, o in work]
    first = b.run_engine(eng, runs)
    second = b.run_engine(eng, runs)  # the same requests again (their prompts now hit the cache)
    res = {"engine_start_s": start_s, "warm_up_s": eng.runtime.warm_up_seconds, "requests": n}
    for name, r in (("first_batch", first), ("second_batch", second)):
        r.pop("outputs")
        res[name] = r
    res["first_over_warm_decode_step"] = (first["mean_decode_step_ms"]
                                          / second["mean_decode_step_ms"])
    res["first_over_warm_seconds"] = first["seconds"] / second["seconds"]
    del eng
    release()
    return res


def shared_stages(b: Bench, result: dict, want: Callable[[str], bool], smoke: bool) -> None:
    """The workloads that share one engine (each on its own prompts: no accidental hits)."""
    eng, _ = b.engine(blocks=512) if smoke else b.engine(max_num_seqs=256, blocks=40_000)
    s, big = (0.05, 4) if smoke else (1.0, 256)
    for name, fn in (
        ("ragged_greedy", lambda: ragged(b, eng, big, 1, False, s)),
        ("ragged_sampled", lambda: ragged(b, eng, big, 2, True, s)),
        ("parallel_n8", lambda: parallel_n8(b, eng, 2 if smoke else 32, 6 if smoke else 128, s)),
        ("beam4", lambda: beam4(b, eng, 2 if smoke else 16, 6 if smoke else 64, s)),
        ("shared_system_prompt", lambda: shared_system_prompt(
            b, eng, big, 64 if smoke else 256, 6 if smoke else 64, s)),
    ):
        if want(name):
            stage(result, name, fn)


OUT_PATH = ""  # where main() writes: every stage rewrites it, so a run cut short keeps what ran


def stage(result: dict, name: str, fn: Callable[[], dict]) -> None:
    t = time.perf_counter()
    try:
        result[name] = fn()
    except Exception as err:
        traceback.print_exc()
        result[name] = {"error": f"{type(err).__name__}: {err}"[:400]}
    result[name]["bench_seconds"] = time.perf_counter() - t
    print(name, json.dumps(result[name])[:1200], flush=True)
    if OUT_PATH:
        with open(OUT_PATH, "w") as f:
            json.dump(result, f, indent=2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/serving_suite.json")
    ap.add_argument("--model", default="default", help="name or path (the GPU run: a folder)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny-random, tiny sizes")
    ap.add_argument("--only", default="", help="comma-separated stages to run")
    ap.add_argument("--sync", action="store_true", help="async scheduling off (but in `concurrency`)")
    ap.add_argument("--no-hf", action="store_true", help="skip the HF baselines")
    args = ap.parse_args()
    global DEVICE, OUT_PATH, ASYNC, NO_HF
    ASYNC, NO_HF = not args.sync, args.no_hf
    OUT_PATH = args.out
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    if args.smoke:
        DEVICE, args.model = "cpu", "tiny-random"
    elif not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --smoke for the CPU check of this script")
    dtype = "float32" if args.smoke else "bfloat16"
    import transformers
    import triton

    b = Bench(args.model, dtype, args.smoke)
    lm = b.lm
    result: dict = {
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else f"cpu x{os.cpu_count()}",
        "model": args.model, "model_source": lm.source, "dtype": dtype, "smoke": args.smoke,
        "torch": torch.__version__, "triton": triton.__version__,
        "transformers": transformers.__version__, "python": platform.python_version(),
        "copy_bandwidth_GBps": b.bw / 1e9, "weight_bytes": b.weight_bytes,
        "async_scheduling": ASYNC, "host_cpu": _cpu_name(), "hf_baselines": not NO_HF,
        "lengths": "seeded synthetic ShareGPT-like: log-normal prompt (mu 4.9, sigma 0.75) and "
                   "output (mu 4.6, sigma 0.6) lengths, clipped to 1024 / 384; random token ids",
    }
    s = 0.05 if args.smoke else 1.0  # smoke: lengths scaled down
    only = set(filter(None, args.only.split(",")))

    def want(name: str) -> bool:
        return not only or name in only

    if want("cold_start"):
        stage(result, "cold_start", lambda: cold_start(b, 4 if args.smoke else 64, s))
    shared_stages(b, result, want, args.smoke)
    release()
    if want("long_context"):
        stage(result, "long_context", lambda: long_context(
            b, (64, 256) if args.smoke else (512, 8000), 8 if args.smoke else 64))
    if want("long_prompt_among_decodes"):
        stage(result, "long_prompt_among_decodes", lambda: long_prompt_among_decodes(
            b, 4 if args.smoke else 64, 16 if args.smoke else 128, 24 if args.smoke else 256,
            300 if args.smoke else 8000, 64 if args.smoke else 2048))
    if want("concurrency"):
        stage(result, "concurrency", lambda: concurrency(
            b, (2, 4) if args.smoke else (8, 64, 256, 512), 16 if args.smoke else 128,
            8 if args.smoke else 128))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
