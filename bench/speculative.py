"""Speculative decoding (prompt lookup) measured: how often drafts are kept, what a verification
step costs against a decode step, and what that does end to end.

    python bench/speculative.py acceptance [--model default]            # CPU is fine: the real model
    python bench/speculative.py verify --model PATH --device cuda       # one GPU: step times
    python bench/speculative.py e2e --model PATH --device cuda          # one GPU: whole runs

`acceptance` runs two workloads with the real default model, greedy, with speculation off and at
k = 2, 4, 8: one where lookup pays (a paragraph to copy-edit, code that repeats a pattern) and one
where it does not (open questions). It records drafted / kept tokens, decode steps per output
token and whether the outputs equal those without speculation. Random weights would not draft
like a trained model, so this one needs the real weights (any device).

`verify` times one step of B sequences at context L computing k + 1 tokens each (a verification)
against the same B sequences computing one (a decode, through the decode graphs on a GPU), and
derives the speedup a per-step acceptance implies: (kept + 1) tokens for the cost of the step.
`e2e` runs whole requests with and without drafts on random weights: greedy decoding of a random
model falls into loops that lookup drafts perfectly (the accepted case), and sampling at
temperature 1 finds nothing to draft (the lookup's cost alone).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from engine.runtime.protocols import StepItem  # noqa: E402

PAYS = [
    "Copy-edit this paragraph and return it with the typos fixed.\n\nParagraph: Paged attention "
    "stores the keys and values of every token in smal fixed-size blocks, and a block table maps "
    "each sequences logical blocks to physical ones, so memory is alocated on demand and shared "
    "betwen sequences.\n\nFixed paragraph:",
    "def area_square(side):\n    return side * side\n\n\ndef area_rectangle(width, height):\n"
    "    return width * height\n\n\ndef area_triangle(base, height):\n",
    "Repeat the list exactly, then add one more colour.\nList: red, green, blue, yellow, purple, "
    "orange, pink, brown.\nRepeated list:",
]
DOES_NOT = [
    "The history of the bicycle begins in",
    "On a cold morning in the mountains, the old shepherd",
    "The best way to learn a new language is",
]


def _decode_steps(eng: LLMEngine, prompts: list[str], params: SamplingParams) -> tuple[list, int, float]:
    """Run the prompts one at a time (a decode step then serves one sequence: steps per token
    are the request's own); returns outputs, decode steps, seconds."""
    outs, steps, t0 = [], 0, time.perf_counter()
    for p in prompts:
        rid = eng.add_request(p, params)
        first = True
        while True:
            res = eng.step()
            steps += 0 if first else 1  # the first step is the prefill
            first = False
            done = [o for o in res.finished if o.request_id == rid]
            if done:
                outs.append(done[0])
                break
    return outs, steps, time.perf_counter() - t0


def acceptance(args: argparse.Namespace) -> dict:
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    rows = []
    for name, prompts in (("lookup pays (copy-edit, code, a list)", PAYS),
                          ("lookup does not pay (prose to continue)", DOES_NOT)):
        plain = None
        for k in (0, 2, 4, 8):
            spec = {"speculative_method": "ngram", "num_speculative_tokens": k} if k else {}
            eng = LLMEngine(EngineConfig(model=args.model, device=args.device, dtype=args.dtype,
                                         block_size=16, num_gpu_blocks=256, **spec))
            outs, steps, secs = _decode_steps(eng, prompts, params)
            tokens = [list(o.outputs[0].token_ids) for o in outs]
            plain = tokens if k == 0 else plain
            drafted = sum(o.draft_tokens for o in outs)
            kept = sum(o.accepted_tokens for o in outs)
            generated = sum(len(t) - 1 for t in tokens)  # the first token comes with the prefill
            rows.append({"workload": name, "k": k, "drafted": drafted, "kept": kept,
                         "acceptance": round(kept / drafted, 3) if drafted else None,
                         "decode_steps": steps, "decoded_tokens": generated,
                         "tokens_per_step": round(generated / steps, 3) if steps else None,
                         "same_tokens_as_k0": tokens == plain, "seconds": round(secs, 2)})
            print(json.dumps(rows[-1]), flush=True)
            eng.close()
    return {"what": "prompt-lookup speculative decoding, greedy, one request at a time",
            "model": args.model, "device": args.device, "dtype": args.dtype,
            "max_tokens": args.max_tokens, "rows": rows}


def _timed(fn, repeats: int, sync) -> float:
    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def verify(args: argparse.Namespace) -> dict:
    """Step times of decode (k = 0) and verification (k + 1 tokens) at batch B and context L."""
    import torch

    eng = LLMEngine(EngineConfig(model=args.model, device=args.device, dtype=args.dtype,
                                 block_size=16, num_gpu_blocks=args.blocks,
                                 enable_prefix_caching=False))
    runtime, bs = eng.runtime, 16
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    rows = []
    for batch in args.batches:
        ctx = args.context
        tables = [list(range(i * (ctx // bs + 2), (i + 1) * (ctx // bs + 2))) for i in range(batch)]
        # context K/V: prefill each sequence's first ctx tokens once (values do not matter for time)
        for table in tables:
            runtime.execute([StepItem(list(range(1, ctx + 1)), 0, table)])
        decode = [([7], ctx, t) for t in tables]
        base = _timed(lambda batch=decode: runtime.execute(batch).greedy(0), args.repeats, sync)
        row = {"batch": batch, "context": ctx, "decode_ms": round(base * 1e3, 3), "verify": []}
        for k in args.ks:
            items = [([7] * (k + 1), ctx, t, k + 1) for t in tables]
            cost = _timed(lambda batch=items: runtime.execute(batch).greedy(0), args.repeats, sync)
            implied = {f"kept {a}": round((a + 1) * base / cost, 2) for a in range(k + 1)}
            row["verify"].append({"k": k, "ms": round(cost * 1e3, 3),
                                  "cost_vs_decode": round(cost / base, 3),
                                  "speedup_if_kept_per_step": implied})
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"what": "one step: B sequences at context L compute 1 token (decode) or k + 1 (verify)",
            "model": args.model, "device": args.device, "dtype": args.dtype,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "torch": torch.__version__, "rows": rows}


def e2e(args: argparse.Namespace) -> dict:
    """Whole runs with and without drafts: greedy (a random model loops: drafts kept) and
    sampled at temperature 1 (a random model's samples never repeat: nothing to draft, the
    lookup's cost alone)."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    prompt = "one two three four five six seven eight " * 8
    rows = []
    first: dict[str, list] = {}
    for label, params in (("greedy (drafts kept)", SamplingParams(max_tokens=args.max_tokens,
                                                                 ignore_eos=True)),
                          ("sampled T=1 (nothing to draft)", SamplingParams(
                              max_tokens=args.max_tokens, temperature=1.0, seed=0,
                              ignore_eos=True))):
        for k in (0, 2, 4, 8):
            spec = {"speculative_method": "ngram", "num_speculative_tokens": k} if k else {}
            eng = LLMEngine(EngineConfig(model=args.model, device=args.device, dtype=args.dtype,
                                         block_size=16, num_gpu_blocks=args.blocks,
                                         enable_prefix_caching=False, **spec))
            prompts = [prompt + str(i) for i in range(args.requests)]
            eng.generate(prompts, params)  # warm up: every kernel and graph this run needs
            times = []
            for _ in range(3):  # the same requests again (no prefix cache: the same work)
                sync()
                t0, steps0 = time.perf_counter(), eng.step_count
                outs = eng.generate(prompts, params)
                sync()
                times.append(time.perf_counter() - t0)
            secs = statistics.median(times)
            steps = (eng.step_count - steps0)
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            ids = [o.outputs[0].token_ids for o in outs]
            same = first.setdefault(label, ids) == ids  # k = 0 runs first
            drafted = sum(o.draft_tokens for o in outs)  # of the last run
            kept = sum(o.accepted_tokens for o in outs)
            rows.append({"workload": label, "k": k, "requests": args.requests,
                         "tokens": tokens, "steps": steps,
                         "seconds": round(secs, 3), "runs_s": [round(t, 3) for t in times],
                         "tokens_per_s": round(tokens / secs, 1),
                         "drafted": drafted, "kept": kept,
                         "acceptance": round(kept / drafted, 3) if drafted else None,
                         "same_tokens_as_k0": same})
            print(json.dumps(rows[-1]), flush=True)
            eng.close()
    return {"what": "whole runs, random weights", "model": args.model, "device": args.device,
            "dtype": args.dtype, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["acceptance", "verify", "e2e"])
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=8192)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    result = {"acceptance": acceptance, "verify": verify, "e2e": e2e}[args.mode](args)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
