"""Hybrid KV memory measured: a model whose layers alternate full attention and a 128-token sliding
window (gpt-oss's pattern) against HF generate and against the same model with every layer full;
and the prefix cache's CPU tier against recomputing.

    python bench/hybrid.py all --device cuda --out bench/results/hybrid_h100.json
    python bench/hybrid.py all --device cpu --smoke        # two layers, small sizes: the script runs
    python bench/hybrid.py speed tier --device cpu --smoke # some parts, in one process

The models are SmolLM2-135M's shapes (30 layers, 9 query heads over 3 KV heads, head_dim 64)
with random weights, built in code from one seed, with the default model's tokenizer (found as
the engine finds it: PAGEDLAB_CACHE). "hybrid" makes layers 0, 2, ... slide (window 128) and
1, 3, ... attend fully; "full" is the same weights with every layer full.

- `equal`: float32, four prompts of 100-300 random tokens, 400 greedy tokens each (far past the
  window): the engine's tokens against HF generate's (SDPA with HF's sliding-window mask), and
  where they first part if they do.
- `speed`: bfloat16, 32 requests of 1,024-token prompts and 256 new tokens, hybrid and full, in
  pools of 8,192 blocks: generated tokens a second (median of 3 runs of new prompts after a
  warm-up); then one request of a 4,096-token prompt: the blocks and bytes it holds in each model.
- `tier`: bfloat16, the full model and a Llama-3.2-1B-shaped one, each in a pool of 256 blocks of
  16: a 2,048-token system prompt is computed, pushed out by a 3,900-token document, then asked
  again with a new question; that request's step with a CPU tier (blocks copied back) against
  without one (recomputed), median of 7.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

# only the repository root: bench/'s own scripts must not shadow installed modules
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402

WINDOW = 128
#: the sizes below; --smoke shrinks them so that the script runs on a CPU in seconds
SIZES = dict(layers=30, new_tokens=400, requests=32, prompt=1024, decode=256, long=4096,
             system=2048, doc=3900, pool=256, speed_runs=3, tier_runs=7)
SMOKE = dict(layers=2, new_tokens=160, requests=2, prompt=200, decode=4, long=600, system=64,
             doc=120, pool=8)
#: Llama-3.2-1B's attention and MLP shapes (16 layers, 32 query heads over 8 KV heads), for the tier
ONE_B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
             num_key_value_heads=8, head_dim=64, max_position_embeddings=8192, rope_theta=500000.0,
             tie_word_embeddings=True, rms_norm_eps=1e-5)
SHAPE = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
             num_key_value_heads=3, head_dim=64, max_position_embeddings=8192, rope_theta=100000.0,
             tie_word_embeddings=True, rms_norm_eps=1e-5)


def build(folder: Path, hybrid: bool, shape: dict | None = None) -> str:
    """Save a random SmolLM2-shaped Qwen2 (hybrid or all full; or of `shape`, all full, in
    bfloat16) with the default tokenizer, or its stand-in on a machine without it (a GPU
    machine reaches no hub: asking it cost run 11's every turn)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from bench.mem_models import tokenizer

    tok, _ = tokenizer()
    n = shape["num_hidden_layers"] if shape else SIZES["layers"]
    kinds = ["sliding_attention", "full_attention"] * (n // 2) if hybrid else ["full_attention"] * n
    dtype = torch.bfloat16 if shape else torch.float32  # a 1B model saves in half the bytes
    shape = shape or {**SHAPE, "num_hidden_layers": n}
    config = Qwen2Config(vocab_size=len(tok), use_sliding_window=hybrid, sliding_window=WINDOW,
                         max_window_layers=0, layer_types=kinds, initializer_range=0.1,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **shape)
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def _sync(device: str) -> None:
    """Wait for the GPU's queued work, so that a clock read after it times that work."""
    if device == "cuda":
        torch.cuda.synchronize()


def _allocated(device: str) -> int:
    _sync(device)
    return int(torch.cuda.memory_allocated()) if device == "cuda" else 0


def _dtype(device: str) -> str:
    return "bfloat16" if device == "cuda" else "float32"  # bf16 matmuls crawl on a CPU


def _prompts(n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def equal(path: str, device: str) -> dict:
    from transformers import AutoModelForCausalLM

    prompts = _prompts(4, 100, 300, 1)
    eng = LLMEngine(EngineConfig(model=path, device=device, dtype="float32", block_size=16,
                                 num_gpu_blocks=512))
    new = SIZES["new_tokens"]
    outs = eng.generate(prompts, SamplingParams(max_tokens=new, ignore_eos=True))
    eng.close()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                              attn_implementation="sdpa").to(device)
    rows = []
    for p, out in zip(prompts, outs, strict=True):
        with torch.inference_mode():
            want = hf.generate(torch.tensor([p], device=device), do_sample=False, max_new_tokens=new,
                               eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        got = list(out.outputs[0].token_ids)
        parted = next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
        rows.append({"prompt_tokens": len(p), "equal": got == want, "first_difference": parted})
    return {"dtype": "float32", "window": WINDOW, "new_tokens": new, "requests": rows}


def _tokens_per_second(path: str, device: str) -> tuple[float, dict]:
    before = _allocated(device)
    # one pool size for both models: 8,192 blocks hold every request whole in either
    eng = LLMEngine(EngineConfig(model=path, device=device, dtype=_dtype(device), block_size=16,
                                 num_gpu_blocks=8192 if device == "cuda" else 1024,
                                 max_num_batched_tokens=8192))
    n, new = SIZES["requests"], SIZES["decode"]
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    warm = _prompts(4, SIZES["prompt"], SIZES["prompt"], 2)
    eng.generate(warm, SamplingParams(max_tokens=16, ignore_eos=True))
    times = []
    for r in range(SIZES["speed_runs"]):  # new prompts each time: no prefix hit from the run before
        prompts = _prompts(n, SIZES["prompt"], SIZES["prompt"], 10 + r)
        _sync(device)
        t0 = time.perf_counter()
        eng.generate(prompts, params)
        _sync(device)
        times.append(time.perf_counter() - t0)
    info = eng.engine_info()
    # one long request: what it holds once prefilled (8,192 blocks: plenty of room)
    long = SIZES["long"]
    eng.add_request(_prompts(1, long, long, 3)[0], SamplingParams(max_tokens=4, ignore_eos=True))
    held: dict[str, int] = {}
    while not held and eng.has_pending_work():  # until its prefill is done (in chunks or whole)
        eng.step()
        for view in eng.snapshot().sequences.values():
            if not any(view.block_tables.values()) or view.prefill_rest:
                continue
            held = {g: sum(b is not None for b in t) for g, t in view.block_tables.items()}
    while eng.has_pending_work():
        eng.step()
    page = int(info["kv bytes per block"])
    held_by_engine = _allocated(device) - before
    eng.close()
    return n * new / statistics.median(times), {
        "allocated_while_open": held_by_engine, "allocated_after_close": _allocated(device) - before,
        "seconds": times, "kv_bytes_per_block": page, "pool_blocks": info["gpu blocks"],
        "long_prompt_tokens": long, "blocks_held": held, "bytes_held": page * sum(held.values()),
    }


def speed(hybrid: str, full: str, device: str) -> dict:
    out = {}
    for name, path in (("hybrid", hybrid), ("full", full)):
        tps, extra = _tokens_per_second(path, device)
        out[name] = {"tokens_per_second": tps, **extra}
    return {"dtype": _dtype(device), "requests": SIZES["requests"], "prompt_tokens": SIZES["prompt"],
            "new_tokens": SIZES["decode"], **out}


def _tier_cycle(path: str, device: str, tier: int) -> dict:
    eng = LLMEngine(EngineConfig(model=path, device=device, dtype=_dtype(device), block_size=16,
                                 num_gpu_blocks=SIZES["pool"], num_offload_blocks=tier))
    system = _prompts(1, SIZES["system"], SIZES["system"], 4)[0]
    doc = _prompts(1, SIZES["doc"], SIZES["doc"], 5)[0]
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    times, firsts, computed = [], [], []
    for r in range(SIZES["tier_runs"] + 1):  # the first cycle warms up
        eng.generate([system + [7, 8, 9, 10 + r]], one)
        eng.generate([doc[r:] + doc[:r]], one)  # another document each time: evicts the prompt
        before = eng.engine_info()["tokens computed by the model"]
        _sync(device)
        t0 = time.perf_counter()
        (out,) = eng.generate([system + [11, 12, 13, 14 + r]], one)
        _sync(device)
        if r:
            times.append(time.perf_counter() - t0)
            computed.append(eng.engine_info()["tokens computed by the model"] - before)
            firsts.append(out.outputs[0].token_ids[0])
    snap = eng.snapshot()
    eng.close()
    return {"seconds": times, "median_s": statistics.median(times), "tokens_computed": computed,
            "first_tokens": firsts, "offload_hit_blocks": snap.metrics.offload_hit_blocks,
            "offloaded_blocks": snap.metrics.offloaded_blocks, "prompt_tokens": len(system) + 4}


def tier(paths: dict[str, str], device: str) -> dict:
    out: dict = {"dtype": _dtype(device)}
    for name, path in paths.items():
        with_tier, without = _tier_cycle(path, device, SIZES["pool"]), _tier_cycle(path, device, 0)
        out[name] = {"with_tier": with_tier, "recompute": without,
                     "speedup": without["median_s"] / with_tier["median_s"],
                     "same_tokens": with_tier["first_tokens"] == without["first_tokens"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="+", choices=["equal", "speed", "tier", "all"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true", help="two layers, small sizes")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=N",
                    help=f"change one of the sizes ({', '.join(SIZES)})")
    args = ap.parse_args()
    if args.smoke:
        SIZES.update(SMOKE)
    for item in args.set:
        name, _, value = item.partition("=")
        if name not in SIZES:
            ap.error(f"--set {item}: sizes are {', '.join(SIZES)}")
        SIZES[name] = int(value)
    folder = Path(tempfile.mkdtemp(prefix="pagedlab-hybrid-"))
    hybrid, full = build(folder / "hybrid", True), build(folder / "full", False)
    results: dict = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                     "torch": torch.__version__, "sizes": dict(SIZES)}
    parts = {"equal": lambda: equal(hybrid, args.device),
             "speed": lambda: speed(hybrid, full, args.device),
             "tier": lambda: tier({"smollm2_shape": full, "llama1b_shape": build(
                 folder / "one_b", False, ONE_B if not args.smoke else {**ONE_B, "num_hidden_layers": 2,
                                                                        "hidden_size": 256,
                                                                        "intermediate_size": 512})},
                 args.device)}
    for name, run in parts.items():
        if name in args.what or "all" in args.what:
            t0 = time.perf_counter()
            try:
                results[name] = run()
            except Exception as err:  # noqa: BLE001 - one part failing must not lose the others
                results[name] = {"error": f"{type(err).__name__}: {err}"}
            results[name]["bench_seconds"] = time.perf_counter() - t0
            print(json.dumps({name: results[name]}, indent=1), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
