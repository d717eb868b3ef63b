"""Engine throughput on a GPU: greedy decode of the default model against HF transformers.

64 requests of 128 prompt tokens and 256 new tokens each (bf16), through
- PagedLab's engine (`LLMEngine.generate`: continuous batching, paged KV, Triton kernels),
- HF `generate` on the same batch (dynamic cache, sdpa),
- HF's own continuous batching (`generate_batch`, paged|sdpa), where this transformers has it.
Reports output tokens/s, the engine's mean decode step time against a roofline (weight bytes +
KV bytes read per step, over the device copy bandwidth measured in the same run), and whether
the engine's outputs equal greedy HF's.

    python bench/engine_throughput.py --out bench/results/engine_throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from engine.models import load_model  # noqa: E402

TEXT = ("PagedAttention stores the KV cache in fixed-size blocks that need not be contiguous, "
        "like pages of virtual memory; a block table maps each sequence's logical blocks to "
        "physical ones, so memory is allocated on demand and shared by copy-on-write. ") * 20


def prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    ids = tokenizer.encode(TEXT)
    return [ids[i * 3: i * 3 + length] for i in range(n)]


def copy_bandwidth() -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    return 2 * x.numel() * 10 / (time.perf_counter() - t)


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/engine_throughput.json")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    args = ap.parse_args()
    n, plen, new = args.requests, args.prompt_len, args.new_tokens
    lm = load_model("default", "cuda", "bfloat16")
    batch = prompts(lm.tokenizer, n, plen)
    assert all(len(p) == plen for p in batch)
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "requests": n, "prompt_len": plen, "new_tokens": new}
    bw = copy_bandwidth()
    result["copy_bandwidth_GBps"] = bw / 1e9

    blocks = n * -(-(plen + new) // 16) + 64
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    warm = LLMEngine(EngineConfig(model="default", device="cuda", dtype="bfloat16", block_size=16,
                                  num_gpu_blocks=blocks))
    warm.generate(batch[:4], SamplingParams(max_tokens=8, ignore_eos=True))
    eng = LLMEngine(EngineConfig(model="default", device="cuda", dtype="bfloat16", block_size=16,
                                 num_gpu_blocks=blocks))
    steps = []
    ids = [eng.add_request(p, params) for p in batch]
    done = {}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while eng.scheduler.has_work():
        ts = time.perf_counter()
        r = eng.step()
        torch.cuda.synchronize()
        steps.append((time.perf_counter() - ts, r.num_prefills, r.num_decodes))
        done.update({o.request_id: list(o.outputs[0].token_ids) for o in r.finished})
    engine_s = time.perf_counter() - t0
    ours = [done[i] for i in ids]
    decode_steps = [s for s, p, d in steps if p == 0 and d > 0]
    result["engine"] = {"seconds": engine_s, "tokens_per_s": n * new / engine_s, "steps": len(steps),
                        "mean_decode_step_ms": 1e3 * sum(decode_steps) / max(1, len(decode_steps))}
    weight_bytes = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    kv_per_token = eng.engine_info()["kv bytes per token"]
    mean_ctx = plen + new / 2
    roofline_s = (weight_bytes + n * mean_ctx * kv_per_token) / bw
    result["roofline_decode_step_ms"] = 1e3 * roofline_s
    result["engine"]["step_over_roofline"] = result["engine"]["mean_decode_step_ms"] / (1e3 * roofline_s)
    print("engine:", result["engine"], flush=True)

    attn = lm.model.config._attn_implementation
    lm.model.set_attn_implementation("sdpa")
    try:
        x = torch.tensor(batch, device="cuda")
        lm.model.generate(x[:4], do_sample=False, max_new_tokens=8, eos_token_id=None, pad_token_id=0)
        out, hf_s = timed(lambda: lm.model.generate(x, do_sample=False, max_new_tokens=new,
                                                    eos_token_id=None, pad_token_id=0))
        hf = out[:, plen:].tolist()
        result["hf_generate"] = {"seconds": hf_s, "tokens_per_s": n * new / hf_s}
        same = sum(a == b for a, b in zip(ours, hf, strict=True))
        result["identical_to_hf_greedy"] = f"{same} of {n}"
        print("hf generate:", result["hf_generate"], "identical:", result["identical_to_hf_greedy"],
              flush=True)
        try:
            from transformers import GenerationConfig

            lm.model.set_attn_implementation("paged|sdpa")
            cfg = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
            # outside inference_mode: its cache is updated in place by plain autograd-free ops
            with torch.inference_mode(False):
                lm.model.generate_batch(inputs=batch[:4], generation_config=cfg)
                outs, cb_s = timed(lambda: lm.model.generate_batch(inputs=batch, generation_config=cfg))
            produced = sum(len(getattr(o, "generated_tokens", []) or []) for o in outs.values())
            if produced != n * new:  # a failed request still returns: count what really came out
                raise RuntimeError(f"generate_batch produced {produced} of {n * new} tokens")
            result["hf_generate_batch"] = {"seconds": cb_s, "tokens_per_s": produced / cb_s}
        except Exception as err:  # the API moves between transformers versions
            result["hf_generate_batch"] = {"error": f"{type(err).__name__}: {err}"[:300]}
        print("hf generate_batch:", result["hf_generate_batch"], flush=True)
    finally:
        lm.model.set_attn_implementation(attn)
    for k in ("hf_generate", "hf_generate_batch"):
        if "tokens_per_s" in result.get(k, {}):
            result[f"engine_over_{k}"] = result["engine"]["tokens_per_s"] / result[k]["tokens_per_s"]
    print(json.dumps(result, indent=1))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
