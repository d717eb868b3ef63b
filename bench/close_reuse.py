"""close() then a second engine of the same size, in one process, with the garbage collector off.

On a CUDA device: build an engine whose KV pool is sized from free memory (`num_gpu_blocks=None`:
90% of the GPU minus weights, context and the activation peak), serve a few greedy requests,
`close()` and `del` it with `gc.disable()`, and measure `torch.cuda.memory_allocated` before and
after; then build a second engine with the same number of blocks and serve the same requests.
Before close() let go at once, the first pool (71 GB on an H100) stayed allocated until a
collection ran, and the second engine ran out of memory.

    python bench/close_reuse.py --out bench/results/close_reuse.json     # on a GPU
    python bench/close_reuse.py --smoke --out /tmp/close_reuse.json      # tiny, on the CPU
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
import traceback
import weakref
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from engine.runtime.models import load_model  # noqa: E402

PROMPTS = ["The capital of France is", "PagedAttention stores the KV cache in",
           "Once upon a time, a small robot", "The three laws of motion are"]


def allocated(device: str) -> int | None:
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    return int(torch.cuda.memory_allocated())


def serve(eng: LLMEngine, max_tokens: int) -> tuple[list[list[int]], float]:
    start = time.perf_counter()
    outs = eng.generate(PROMPTS, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return [list(o.outputs[0].token_ids) for o in outs], round(time.perf_counter() - start, 3)


def build(cfg: EngineConfig, device: str) -> tuple[LLMEngine, dict[str, Any]]:
    before = allocated(device)
    start = time.perf_counter()
    eng = LLMEngine(cfg)
    info = eng.engine_info()
    return eng, {"num_gpu_blocks": info["gpu blocks"], "pool_bytes": info["kv_bytes_per_rank"][0],
                 "sizing": info["pool size"], "build_s": round(time.perf_counter() - start, 2),
                 "allocated_before": before, "allocated_after_build": allocated(device)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = "cpu" if args.smoke else "cuda"
    model = "tiny-random" if args.smoke else args.model
    load_model(model, device, "auto")  # the shared weights: loaded once, outside the measure
    common = dict(model=model, device=device, block_size=16, max_num_seqs=64)
    first_cfg = EngineConfig(num_gpu_blocks=256 if args.smoke else None, **common)
    gc.collect()
    gc.disable()  # what is freed below is freed by reference counting alone
    result: dict[str, Any] = {"device": device, "model": model, "gc": "disabled"}
    if device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
        result["gpu_total_bytes"] = torch.cuda.mem_get_info()[1]
    eng, first = build(first_cfg, device)
    tokens, first["serve_s"] = serve(eng, args.max_tokens)
    first["allocated_after_serve"] = allocated(device)
    pool = weakref.ref(eng.runtime.cache.kv_cache)
    start = time.perf_counter()
    eng.close()
    del eng
    first["close_s"] = round(time.perf_counter() - start, 4)
    first["allocated_after_close"] = allocated(device)
    first["kv_pool_alive_after_close"] = pool() is not None
    if device == "cuda":
        first["freed_bytes"] = first["allocated_after_serve"] - first["allocated_after_close"]
        first["freed_vs_pool"] = round(first["freed_bytes"] / first["pool_bytes"], 4)
    result["first"] = first
    second_cfg = EngineConfig(num_gpu_blocks=first["num_gpu_blocks"], **common)
    try:
        eng, second = build(second_cfg, device)
        again, second["serve_s"] = serve(eng, args.max_tokens)
        second["allocated_after_serve"] = allocated(device)
        second["same_tokens_as_first"] = again == tokens
        eng.close()
        del eng
        second["allocated_after_close"] = allocated(device)
        result["second"] = second
        result["ok"] = not first["kv_pool_alive_after_close"] and again == tokens
    except Exception as err:  # noqa: BLE001 - the failure is the measurement
        result["second"] = {"error": f"{type(err).__name__}: {err}"[:2000],
                            "traceback": traceback.format_exc()[-4000:]}
        result["ok"] = False
    finally:
        gc.enable()
    result["python"], result["torch"] = platform.python_version(), torch.__version__
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "results", "close_reuse.json"))
    ap.add_argument("--model", default="default")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--smoke", action="store_true", help="tiny-random on the CPU (checks the script)")
    args = ap.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("close_reuse needs a CUDA device (or --smoke for the CPU check)")
    result = run(args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
