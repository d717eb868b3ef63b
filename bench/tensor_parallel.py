"""Tensor parallelism on two GPUs: a random-weight Llama of ~1.1B parameters, TP = 2 against TP = 1.

The model has TinyLlama-1.1B's shape (22 layers, hidden 2048, 32 query heads, 4 KV heads,
MLP 5632) with the default model's vocabulary and random weights (engine/tp/models.py), written
once to a local folder. For TP = 1 (one process, CUDA graphs on, and again eagerly) and TP = 2
(two worker processes over NCCL, one GPU each, eager), the same greedy batch runs to completion:

- tokens/s over the whole run and the mean decode step (wall time of `engine.step()` in steps
  that only decode),
- the bytes each GPU holds (weights and KV pool per rank, and what torch allocated on rank 0),
- what crosses the wire per decode step (engine -> workers, logits back, all-reduce payload),
- whether the greedy outputs are equal, in float32 (a shorter run) and in bf16 (the timed runs;
  an all-reduce adds partial sums in another order than one matmul, so bf16 may part ways).

NVLink multicast stays off in every process (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1), as the lab machines require.

    python bench/tensor_parallel.py --out bench/results/tensor_parallel.json     # 2 GPUs
    python bench/tensor_parallel.py --smoke --out /tmp/tp.json                    # CPU, gloo
"""

from __future__ import annotations

import os

# before torch: the workers inherit this environment
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from engine.runtime.models import cache_root  # noqa: E402
from engine.tp.models import LLAMA_1B, TINY_KV2, save_random_llama  # noqa: E402


def prompts(eng: LLMEngine, n: int, length: int) -> list[list[int]]:
    text = ("Tensor parallelism splits every layer's heads over GPUs; the scheduler keeps one "
            "block table and sends it to every worker at each step. ") * 40
    ids = eng.tokenizer.encode(text)
    return [ids[i * 5: i * 5 + length] for i in range(n)]


def run(model: str, tp: int, dtype: str, device: str, batch_spec: tuple[int, int, int],
        graphs: bool = True) -> dict:
    n, plen, new = batch_spec
    blocks = n * -(-(plen + new) // 16) + 16
    cfg = EngineConfig(model=model, tensor_parallel_size=tp, device=device, dtype=dtype,
                       block_size=16, num_gpu_blocks=blocks, max_num_seqs=n,
                       enable_prefix_caching=False,  # the warm-up's prompts must not be hits
                       max_num_batched_tokens=max(2048, n * plen))
    start = time.perf_counter()
    eng = LLMEngine(cfg)
    try:
        startup = time.perf_counter() - start
        if tp == 1 and not graphs:
            eng.runtime.runner.graphs.use_graphs = eng.runtime.runner.graphs.pad = False
        batch = prompts(eng, n, plen)
        params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
        # warm-up at the timed batch size (TP = 1 captures its decode graph for it here)
        eng.generate(batch, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        ids = [eng.add_request(p, params) for p in batch]
        done: dict[int, tuple[int, ...]] = {}
        decode_steps: list[float] = []
        wire: list[dict] = []
        t0 = time.perf_counter()
        while len(done) < n:
            s0 = time.perf_counter()
            res = eng.step()
            dt = time.perf_counter() - s0
            if res.num_decodes and not res.num_prefills:
                decode_steps.append(dt)
                if tp > 1 and len(wire) < 1:
                    info = eng.engine_info()
                    wire.append({k.removeprefix("tp last step: "): v for k, v in info.items()
                                 if k.startswith("tp last step")} | {"sequences": res.num_decodes})
            for out in res.finished:
                done[out.request_id] = out.outputs[0].token_ids
        seconds = time.perf_counter() - t0
        info = eng.engine_info()
        if tp == 1:
            weights = sum(p.numel() * p.element_size()
                          for p in eng.runtime.loaded.model.parameters())
            held = {"weight_bytes": weights, "kv_pool_bytes": info["kv_bytes_per_rank"][0]}
            if device == "cuda":
                held["allocated_bytes"] = torch.cuda.memory_allocated()
            per_gpu = [held]
        else:
            per_gpu = [{"weight_bytes": info["weight bytes per rank"], "kv_pool_bytes": kv}
                       for kv in info["kv_bytes_per_rank"]]
            per_gpu[0]["allocated_bytes"] = info["device bytes allocated on rank 0 (at start)"]
        return {
            "tensor_parallel_size": tp, "graphs": graphs if tp == 1 else False,
            "startup_s": startup, "seconds": seconds, "tokens_per_s": n * new / seconds,
            "decode_steps": len(decode_steps),
            "mean_decode_step_ms": 1e3 * statistics.fmean(decode_steps) if decode_steps else None,
            "median_decode_step_ms": (1e3 * statistics.median(decode_steps)
                                      if decode_steps else None),
            "per_gpu": per_gpu, "wire_per_decode_step": wire[0] if wire else None,
            "outputs": [done[i] for i in ids],
        }
    finally:
        eng.close()


def compare(a: list, b: list) -> dict:
    same = sum(x == y for x, y in zip(a, b, strict=True))
    first = [next((i for i, (p, q) in enumerate(zip(x, y, strict=True)) if p != q), None)
             for x, y in zip(a, b, strict=True)]
    return {"identical": same, "of": len(a),
            "first_difference_at": [f for f in first if f is not None][:16]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/tensor_parallel.json")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--model-dir", default=None, help="where the random model is written")
    ap.add_argument("--smoke", action="store_true", help="CPU, gloo, a tiny model: checks the script")
    args = ap.parse_args()
    if args.smoke:
        device, shape, half = "cpu", TINY_KV2, "float32"
        args.requests, args.prompt_len, args.new_tokens = 4, 16, 8
        folder = Path(args.model_dir or cache_root() / "random-llama-kv2") / "llama-kv2"
        save_random_llama(folder, shape)
    else:
        if torch.cuda.device_count() < args.tp:
            sys.exit(f"needs {args.tp} GPUs, torch sees {torch.cuda.device_count()}; "
                     f"--smoke runs the CPU check of this script")
        device, shape, half = "cuda", LLAMA_1B, "bfloat16"
        folder = Path(args.model_dir or cache_root() / "random-llama-1.1b") / "llama-1.1b"
        save_random_llama(folder, shape, dtype=torch.bfloat16)
    spec = (args.requests, args.prompt_len, args.new_tokens)
    params = (shape["hidden_size"] * shape["intermediate_size"] * 3 * shape["num_hidden_layers"]
              + shape["hidden_size"] * shape["head_dim"] * shape["num_hidden_layers"]
              * (2 * shape["num_attention_heads"] + 2 * shape["num_key_value_heads"]))
    result: dict = {
        "device": (torch.cuda.get_device_name() if device == "cuda" else f"cpu x{os.cpu_count()}"),
        "gpus": torch.cuda.device_count() if device == "cuda" else 0,
        "torch": torch.__version__, "python": platform.python_version(),
        "env": {k: os.environ[k] for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
        "model": {"shape": shape, "layer_parameters": params, "folder": str(folder)},
        "dtype": half, "requests": spec[0], "prompt_len": spec[1], "new_tokens": spec[2],
        "smoke": args.smoke,
    }
    tp1 = run(str(folder), 1, half, device, spec, graphs=True)
    tp1_eager = run(str(folder), 1, half, device, spec, graphs=False) if device == "cuda" else None
    tpn = run(str(folder), args.tp, half, device, spec)
    result["tp1"], result[f"tp{args.tp}"] = tp1, tpn
    if tp1_eager:
        result["tp1_eager"] = tp1_eager
    result[f"tp{args.tp}_vs_tp1_greedy_{half}"] = compare(tp1["outputs"], tpn["outputs"])
    if half != "float32":  # equality where rounding order cannot decide: float32, a short run
        short = (min(8, spec[0]), spec[1], 32)
        a = run(str(folder), 1, "float32", device, short, graphs=False)
        b = run(str(folder), args.tp, "float32", device, short)
        result[f"tp{args.tp}_vs_tp1_greedy_float32"] = compare(a["outputs"], b["outputs"])
    base = tp1_eager or tp1
    result[f"tp{args.tp}_over_tp1_tokens_per_s"] = tpn["tokens_per_s"] / base["tokens_per_s"]
    for r in (tp1, tp1_eager, tpn):
        if r:
            r.pop("outputs")
    print(json.dumps(result, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
