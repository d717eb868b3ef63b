"""Steps that stay on the device (issue 31), measured: speculative decoding against none, the
engine's tokens per pass against Hugging Face's prompt lookup, a hybrid model against the same
model all full, and a 1.2B model's decode step against its HBM roofline, with the host's share.

    python bench/device_step.py --device cuda --out bench/results/device_step_h100.json
    python bench/device_step.py --smoke --out /tmp/device_step.json     # CPU: the script runs

Models are random weights in SmolLM2-135M's shapes (30 layers, 9 / 3 heads of 64) and in
Llama-3.2-1B's (16 layers, hidden 2048, 32 / 8 heads: 1.24e9 parameters), built in code from one
seed, bfloat16, async scheduling on. Every ratio compares two runs made in this one process on
the same device, both warm. For drafts, the SmolLM2-shaped Llama keeps SmolLM2's initialiser
(0.02) and tied embeddings: its greedy output soon repeats a token forever, text that prompt
lookup drafts perfectly (HF's prompt lookup is measured on the same model and prompt).

- `spec`: batches of 1, 8 and 64 requests, 128 new tokens each, k = 4 drafts against none.
  Greedy on a repetitive prompt (a random model loops: its drafts are kept) and sampled at
  temperature 1 (nothing repeats: nothing to draft). Tokens/s (median of 7 runs after a warm-up,
  the two engines' runs interleaved), and tokens per pass: a sequence's output tokens over the
  decode steps it took. Lookups try n-grams of 4 down to 1 token, as HF's tries 2 and 1.
- `hf_lookup`: the same model and prompt in HF `generate` with prompt_lookup_num_tokens=4, batch
  1: tokens per forward pass (calls of the model counted by a hook).
- `hybrid`: 32 requests of 1,024- and 4,096-token prompts, 256 new tokens: half the layers with a
  128-token window against every layer full, in pools of the same bytes: tokens/s, and the
  steady decode step with its graph's GPU time.
- `roofline`: the 1.2B model at 64 and 256 sequences of 512-token prompts: the steady decode
  step's wall time (async, and synchronous), the graph's GPU time, the roofline (weights + KV over
  the copy bandwidth measured here); the host's time a step is the synchronous step less the GPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench import hybrid  # noqa: E402
from bench.copy_bandwidth import copy_bandwidth  # noqa: E402
from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402

REPEAT = "one two three four five six seven eight " * 8
FULL = dict(batches=[1, 8, 64], new=128, repeats=7, hybrid_prompts=[1024, 4096], hybrid_requests=32,
            hybrid_new=256, roof_seqs=[64, 256], roof_prompt=512, roof_new=96)
SMOKE = dict(batches=[1, 4], new=24, repeats=2, hybrid_prompts=[160], hybrid_requests=4, hybrid_new=16,
             roof_seqs=[4], roof_prompt=48, roof_new=8)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def looping_model(folder: Path) -> str:
    """SmolLM2-135M's config with random weights (initialiser 0.02, tied embeddings), bf16."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.runtime.models import _load_default_tokenizer

    tok = _load_default_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), tie_word_embeddings=True, initializer_range=0.02,
                         max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         **{k: v for k, v in hybrid.SHAPE.items() if k not in (
                             "max_position_embeddings", "rope_theta", "tie_word_embeddings",
                             "rms_norm_eps")})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def engine(path: str, device: str, k: int, seqs: int, blocks: int, **kw) -> LLMEngine:
    # n-grams of 4 down to 1 token: HF's prompt lookup tries 2 and 1 (max_matching_ngram_size=2)
    spec = {"speculative_method": "ngram", "num_speculative_tokens": k,
            "prompt_lookup_min": 1} if k else {}
    return LLMEngine(EngineConfig(model=path, device=device, dtype=dtype(device), block_size=16,
                                  num_gpu_blocks=blocks, max_num_seqs=seqs,
                                  enable_prefix_caching=False, max_num_batched_tokens=32768,
                                  async_scheduling=kw.pop("async_scheduling", True), **spec, **kw))


def decoding(path: str, device: str, n: int, plen: int, new: int) -> LLMEngine:
    """The roofline's engine of n sequences (no drafts), warm, with n prompts of plen tokens
    added (new tokens each), stepped to its first step that only decodes."""
    eng = engine(path, device, 0, n, n * -(-(plen + new) // 16) + 64)
    prompts = hybrid._prompts(n, plen, plen, n)
    eng.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))
    for p in prompts:
        eng.add_request(p, SamplingParams(max_tokens=new, ignore_eos=True))
    while eng.step().num_prefills or eng.scheduler.waiting:
        pass
    return eng


def dtype(device: str) -> str:
    return "bfloat16" if device == "cuda" else "float32"


def timed_runs(engines: dict[int, LLMEngine], prompts: list, params: SamplingParams,
               device: str, repeats: int, alternate: bool = False) -> dict[int, dict]:
    """A warm-up run on each engine, then `repeats` runs of the same requests on each in turn
    (the engines interleaved, so a slow spell of the machine hits both; no prefix cache: the
    same work every run; `alternate`: their order reversed every other round, so that neither
    always runs first). Medians."""
    got: dict[int, dict] = {}
    for eng in engines.values():
        eng.generate(prompts, params)
    times: dict[int, list[float]] = {k: [] for k in engines}
    for r in range(repeats):
        order = list(engines.items())
        for k, eng in (order[::-1] if alternate and r % 2 else order):
            sync(device)
            t0, s0 = time.perf_counter(), eng.step_count
            outs = eng.generate(prompts, params)
            sync(device)
            times[k].append(time.perf_counter() - t0)
            steps = eng.step_count - s0
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            got[k] = {"tokens": tokens, "steps": steps,
                      # a sequence's tokens over the steps after its prefill (all decode in each)
                      "tokens_per_pass": round(tokens / len(outs) / max(1, steps - 1), 3),
                      "drafted": sum(o.draft_tokens for o in outs),
                      "kept": sum(o.accepted_tokens for o in outs),
                      "ids": [list(o.outputs[0].token_ids) for o in outs]}
    for k, row in got.items():
        secs = statistics.median(times[k])
        row.update(seconds=round(secs, 4), runs_s=[round(t, 4) for t in times[k]],
                   tokens_per_s=round(row["tokens"] / secs, 1))
    return got


def spec(path: str, device: str, sizes: dict) -> dict:
    rows = []
    top = max(sizes["batches"])
    engines = {k: engine(path, device, k, top, top * 40 + 64) for k in (0, 4)}
    for batch in sizes["batches"]:
        for label, params in (("greedy, repetitive", SamplingParams(max_tokens=sizes["new"],
                                                                    ignore_eos=True)),
                              ("sampled T=1, nothing to draft", SamplingParams(
                                  max_tokens=sizes["new"], temperature=1.0, seed=1,
                                  ignore_eos=True))):
            prompts = [REPEAT + str(i) for i in range(batch)]
            got = timed_runs(engines, prompts, params, device, sizes["repeats"])
            row = {"batch": batch, "workload": label,
                   "drafts_over_none": round(got[4]["tokens_per_s"] / got[0]["tokens_per_s"], 3),
                   "same_tokens": got[4].pop("ids") == got[0].pop("ids"),
                   "k0": got[0], "k4": got[4]}
            rows.append(row)
            print(json.dumps({x: row[x] for x in ("batch", "workload", "drafts_over_none",
                                                   "same_tokens")}
                             | {"tokens_per_pass_k4": got[4]["tokens_per_pass"]}), flush=True)
    for eng in engines.values():
        eng.close()
    return {"rows": rows}


def spec_extra(path: str, device: str, sizes: dict) -> dict:
    """Tokens per pass with steps landing at once (no async scheduling: every step knows its
    tail), batch 1; and nothing to draft at the largest batch again, with 15 runs each."""
    out = {}
    engines = {k: engine(path, device, k, 1, 64 + 40, async_scheduling=False) for k in (0, 4)}
    got = timed_runs(engines, [REPEAT + "0"], SamplingParams(max_tokens=sizes["new"],
                                                            ignore_eos=True), device, 3)
    out["sync_batch_1"] = {"tokens_per_pass_k4": got[4]["tokens_per_pass"],
                           "drafts_over_none": round(got[4]["tokens_per_s"] / got[0]["tokens_per_s"], 3),
                           "same_tokens": got[4]["ids"] == got[0]["ids"]}
    for eng in engines.values():
        eng.close()
    top = max(sizes["batches"])
    engines = {k: engine(path, device, k, top, top * 40 + 64) for k in (0, 4)}
    params = SamplingParams(max_tokens=sizes["new"], temperature=1.0, seed=1, ignore_eos=True)
    got = timed_runs(engines, [REPEAT + str(i) for i in range(top)], params, device,
                     2 * sizes["repeats"] + 1)
    out[f"nothing_to_draft_batch_{top}"] = {
        "drafts_over_none": round(got[4]["tokens_per_s"] / got[0]["tokens_per_s"], 3),
        "k0_runs_s": got[0]["runs_s"], "k4_runs_s": got[4]["runs_s"], "drafted": got[4]["drafted"]}
    for eng in engines.values():
        eng.close()
    print(json.dumps({k: {a: b for a, b in v.items() if "runs" not in a} for k, v in out.items()}),
          flush=True)
    return out


def hf_lookup(path: str, device: str, sizes: dict) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype(device))).to(device)
    ids = torch.tensor([tok.encode(REPEAT + "0")], device=device)
    calls = [0]
    model.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    out = {}
    for label, kw in (("plain", {}), ("prompt_lookup_4", {"prompt_lookup_num_tokens": 4})):
        for _ in range(2):  # the second run is timed
            calls[0] = 0
            sync(device)
            t0 = time.perf_counter()
            with torch.inference_mode():
                gen = model.generate(ids, do_sample=False, max_new_tokens=sizes["new"],
                                     min_new_tokens=sizes["new"], pad_token_id=0, **kw)
            sync(device)
            secs = time.perf_counter() - t0
        new = gen.shape[1] - ids.shape[1]
        out[label] = {"new_tokens": new, "forward_passes": calls[0],
                      "tokens_per_pass": round(new / max(1, calls[0] - 1), 3),  # the prefill aside
                      "tokens_per_s": round(new / secs, 1)}
    del model
    return out


def hybrid_speed(paths: dict[str, str], device: str, sizes: dict) -> dict:
    out = {}
    n, new = sizes["hybrid_requests"], sizes["hybrid_new"]
    for plen in sizes["hybrid_prompts"]:
        row = {}
        for name, path in paths.items():
            # the same bytes for both: the hybrid's pages hold half the layers, so twice the
            # blocks (a prefill chunk holds its blocks in both groups until the window drops them)
            blocks = (n * -(-(plen + new) // 16) + 256) * (2 if name == "hybrid" else 1)
            eng = LLMEngine(EngineConfig(model=path, device=device, dtype=dtype(device),
                                         block_size=16, num_gpu_blocks=blocks,
                                         max_num_batched_tokens=8192, async_scheduling=True))
            params = SamplingParams(max_tokens=new, ignore_eos=True)
            eng.generate(hybrid._prompts(2, plen, plen, 2), SamplingParams(max_tokens=8, ignore_eos=True))
            times = []
            for r in range(3):
                prompts = hybrid._prompts(n, plen, plen, 10 + r)
                sync(device)
                t0 = time.perf_counter()
                eng.generate(prompts, params)
                sync(device)
                times.append(time.perf_counter() - t0)
            steady = mid_run(eng, hybrid._prompts(n, plen, plen, 20), params)
            eng.close()
            row[name] = {"tokens_per_s": round(n * new / statistics.median(times), 1),
                         "runs_s": [round(t, 3) for t in times], **steady}
        row["hybrid_over_full"] = round(row["hybrid"]["tokens_per_s"] / row["full"]["tokens_per_s"], 3)
        out[str(plen)] = row
        print(json.dumps({"prompt": plen, "hybrid_over_full": row["hybrid_over_full"]}), flush=True)
    return out


def roofline(path: str, device: str, sizes: dict) -> dict:
    from engine.runtime.models import load_model

    lm = load_model(path, device, dtype(device))
    weight_bytes = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    kv_per_token = 2 * lm.num_layers * lm.num_kv_heads * lm.head_dim * lm.dtype.itemsize
    bw = copy_bandwidth(device)
    out = {"copy_bandwidth_gb_s": round(bw / 1e9, 1), "weight_bytes": weight_bytes,
           "parameters": sum(p.numel() for p in lm.model.parameters())}
    plen, new = sizes["roof_prompt"], sizes["roof_new"]
    for n in sizes["roof_seqs"]:
        row = {"roofline_ms": 1e3 * (weight_bytes + n * (plen + new // 2) * kv_per_token) / bw}
        for overlap in (True, False):
            eng = engine(path, device, 0, n, n * -(-(plen + new) // 16) + 64,
                         async_scheduling=overlap)
            prompts = hybrid._prompts(n, plen, plen, n)
            eng.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))
            run = mid_run(eng, prompts, SamplingParams(max_tokens=new, ignore_eos=True),
                          again=hybrid._prompts(n, plen, plen, n + 1) if overlap else None)
            key = "async" if overlap else "sync"
            row[f"{key}_step_ms"] = run["step_ms"]
            row[f"{key}_steady_steps"] = run["steady_steps"]
            if overlap:
                row["async_step_ms_after_probe"] = run["step_ms_after_probe"]
                row["graph_gpu_ms"] = run["graph_gpu_ms"]
                row["kernels"] = run["kernels"]
                row["host_profile"] = host_profile(eng, prompts, new)
            eng.close()
        row["async_over_roofline"] = round(row["async_step_ms"] / row["roofline_ms"], 3)
        if row.get("graph_gpu_ms"):
            row["graph_over_roofline"] = round(row["graph_gpu_ms"] / row["roofline_ms"], 3)
            row["host_ms_per_step"] = round(row["sync_step_ms"] - row["graph_gpu_ms"], 3)
        out[str(n)] = row
        print(json.dumps({"seqs": n} | row), flush=True)
    return out


def host_profile(eng: LLMEngine, prompts: list, new: int) -> list[str]:
    """Where a steady step's host time goes: cProfile over the decode steps of the same
    requests again (the profiler slows the host; its shares are what matter)."""
    import cProfile
    import io
    import pstats

    for p in prompts:
        eng.add_request(p, SamplingParams(max_tokens=new, ignore_eos=True))
    while eng.scheduler.waiting:
        eng.step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(new // 2):
        eng.step()
    prof.disable()
    while eng.has_pending_work():
        eng.step()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue().splitlines()[:45]


def _replay_ms(eng: LLMEngine, n: int) -> float | None:
    """One replay of the decode graph of n sequences on the inputs of the step that just ran
    (it writes the same K/V into the same slots again): the step's GPU part, median of 20."""
    graphs = eng.runtime.runner.graphs
    key = (graphs.bucket(n), 1)
    if not graphs.use_graphs or key not in graphs.graphs:
        return None
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graphs.graphs[key].replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return round(statistics.median(times), 4)


def mid_run(eng: LLMEngine, prompts: list, params: SamplingParams, again: list | None = None
            ) -> dict:
    """The requests run to the end, and the steps' wall times in their steady part (every one
    decoding, nothing else). Then `again` (default: the same prompts) run the same way, and
    halfway through, on that steady step's inputs, the decode graph's GPU time and its kernels;
    that run's steady step is `step_ms_after_probe`. Not on the last step's inputs after a
    run: replayed there the 256-sequence graph of the 1.2B took 2.86 ms, on a steady step's
    3.33, as its replays inside the loop did (run 67, `bench/replay_gaps.py`)."""
    n = len(prompts)
    walls = _steady_walls(eng, prompts, params)
    probe: dict = {}

    def at_half() -> None:
        probe.update(graph_gpu_ms=_replay_ms(eng, n), kernels=_kernels(eng, n))

    later = _steady_walls(eng, again or prompts, params, at_half)
    out = {"steady_steps": len(walls), "step_ms": _median_ms(walls), **probe}
    if again is not None:
        out["step_ms_after_probe"] = _median_ms(later)
    return out


def _steady_walls(eng: LLMEngine, prompts: list, params: SamplingParams,
                  probe: Callable[[], None] | None = None) -> list[float]:
    """The wall time of each steady step (all the prompts decoding, nothing else) of a run of
    `prompts`; `probe()` is called once, halfway through the steady steps (the step after it
    is not kept: the probe's wait for the device delays it)."""
    for p in prompts:
        eng.add_request(p, params)
    walls: list[float] = []
    half = max(1, params.max_tokens // 2)
    skip = False
    while eng.has_pending_work():
        t0 = time.perf_counter()
        result = eng.step()
        wall = time.perf_counter() - t0
        if result.num_prefills == 0 and result.num_decodes == len(prompts):
            if not skip:
                walls.append(wall)
            skip = False
            if probe is not None and len(walls) == half:
                probe()
                probe, skip = None, True
    return walls


def _median_ms(walls: list[float]) -> float | None:
    return round(1e3 * statistics.median(walls[2:]), 3) if len(walls) > 2 else None


def _kernels(eng: LLMEngine, n: int) -> list | None:
    """The decode forward's kernels by GPU time (the graph's work, run eagerly under the
    profiler on the step's inputs), the ten largest and their sum."""
    graphs = eng.runtime.runner.graphs
    if not graphs.use_graphs:
        return None
    from collections import defaultdict

    size = graphs.bucket(n)
    with torch.inference_mode():
        graphs._compute(size, 1)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                graphs._compute(size, 1)
            torch.cuda.synchronize()
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            by_name[ev.name][0] += ev.device_time_total / 3 / 1e3
            by_name[ev.name][1] += 1 / 3
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:10]
    return [{"all_kernels_ms": round(sum(v[0] for v in by_name.values()), 4),
             "launches": round(sum(v[1] for v in by_name.values()))}] + \
        [{"kernel": k[:80], "ms": round(v[0], 4), "count": round(v[1])} for k, v in top]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--only", nargs="+", default=["spec", "hf_lookup", "hybrid", "roofline"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sizes = SMOKE if args.smoke else FULL
    if args.smoke:
        hybrid.SIZES.update(hybrid.SMOKE)
    folder = Path(tempfile.mkdtemp(prefix="device-step-"))
    result: dict = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                    "torch": torch.__version__, "smoke": args.smoke, "sizes": sizes}
    full = hybrid.build(folder / "full", hybrid=False)
    loops = looping_model(folder / "loops") if {"spec", "spec_extra", "hf_lookup"} & set(args.only) \
        else None
    for stage in args.only:
        t0 = time.perf_counter()
        if stage == "spec":
            result["spec"] = spec(loops, args.device, sizes)
        elif stage == "spec_extra":
            result["spec_extra"] = spec_extra(loops, args.device, sizes)
        elif stage == "hf_lookup":
            result["hf_lookup"] = hf_lookup(loops, args.device, sizes)
        elif stage == "hybrid":
            paths = {"hybrid": hybrid.build(folder / "hybrid", hybrid=True), "full": full}
            result["hybrid"] = hybrid_speed(paths, args.device, sizes)
        elif stage == "roofline":
            shape = hybrid.ONE_B if not args.smoke else {**hybrid.SHAPE, "num_hidden_layers": 2}
            result["roofline"] = roofline(hybrid.build(folder / "one_b", False, shape), args.device,
                                          sizes)
        result.setdefault("stage_seconds", {})[stage] = round(time.perf_counter() - t0, 1)
        with open(args.out, "w") as f:  # after every stage: a later one may not finish
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
