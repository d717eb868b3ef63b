"""Greedy decoding on a GPU in bf16: the engine (Triton kernels) against HF `generate` (sdpa).

In bf16 two implementations of the same model round differently, so greedy paths may part where
the top two logits are within rounding of each other. For every prompt this reports the first
step where they part and HF's top-2 logit gap there, to show whether it was such a near tie.

    python bench/gpu_equivalence.py --out bench/results/gpu_equivalence.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from engine.runtime.models import load_model  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a paged KV cache far away,",
    "List three uses of copy-on-write:",
]


def hf_greedy(model, ids: list[int], max_new: int) -> list[int]:
    out = model.generate(torch.tensor([ids], device="cuda"), do_sample=False, max_new_tokens=max_new,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def top2_gap(model, ids: list[int]) -> float:
    logits = model(torch.tensor([ids], device="cuda")).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/gpu_equivalence.json")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    rows = []
    for name in ("tiny-random", "default"):
        lm = load_model(name, "cuda", "bfloat16")
        for block_size in (1, 4, 16):
            for prefix in (True, False):
                eng = LLMEngine(EngineConfig(model=name, device="cuda", dtype="bfloat16",
                                             block_size=block_size, num_gpu_blocks=2048,
                                             enable_prefix_caching=prefix))
                kernel = eng.engine_info()["attention kernel"]
                ids = [eng.tokenizer.encode(p) for p in PROMPTS]
                outs = eng.generate(ids, SamplingParams(max_tokens=args.max_tokens, ignore_eos=True))
                eng.check_invariants()
                attn = lm.model.config._attn_implementation
                lm.model.set_attn_implementation("sdpa")
                try:
                    for p, out in zip(ids, outs, strict=True):
                        ours = list(out.outputs[0].token_ids)
                        ref = hf_greedy(lm.model, p, args.max_tokens)
                        part = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=True)) if a != b),
                                    None)
                        gap = None if part is None else top2_gap(lm.model, p + ref[:part])
                        rows.append({"model": name, "block_size": block_size, "prefix_caching": prefix,
                                     "kernel": kernel, "prompt_tokens": len(p),
                                     "identical": part is None, "first_difference_at": part,
                                     "hf_top2_logit_gap_there": gap})
                        print(rows[-1], flush=True)
                finally:
                    lm.model.set_attn_implementation(attn)
    same = sum(r["identical"] for r in rows)
    print(f"identical greedy outputs: {same} of {len(rows)}")
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "max_tokens": args.max_tokens, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
