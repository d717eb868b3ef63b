"""Where a 1.2B decode step's GPU time goes, kernel by kernel: each kind of launch of one layer
(paged attention, the four projections, the LM head, the fused norms, RoPE and SiLU) timed
alone on the step's shapes, as bytes over time against the device's copy bandwidth; and the
decode attention's tiles and split count swept, since the kernel was tuned on SmolLM2's shapes.

    python bench/kernel_probe.py --seqs 64 256              # the table, on a GPU
    python bench/kernel_probe.py --once --seqs 64           # each launch once: for `ncu`

Random data (never zeros), bfloat16, Llama-3.2-1B's shapes (hidden 2048, 32 / 8 heads of 64,
MLP 8192, vocabulary 49,152), contexts of 560 tokens through shuffled block tables of 16-token
blocks. Weights are rotated among copies larger than the L2 cache together, so that a timing
reads memory, not the cache. Each kind is timed inside a CUDA graph, as the engine runs it
(`_time` says why).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

HIDDEN, HEADS, KV_HEADS, DIM, MLP, VOCAB, BS = 2048, 32, 8, 64, 8192, 49152, 16
#: (block_n, num_warps, num_stages, num_splits) for the decode attention; None = the heuristic's
SWEEP = [None, (64, 4, 2, 1), (64, 4, 3, 1), (128, 4, 2, 1), (128, 8, 2, 1), (32, 4, 3, 1),
         (64, 4, 2, 2), (128, 4, 3, 2), (64, 2, 3, 1), (64, 4, 4, 1), (64, 4, 2, 4)]


def graph_runner(fn: Callable[[int], None], reps: int = 20) -> tuple[Callable[[], None], bool]:
    """fn(0 .. reps - 1) captured in one CUDA graph after a warm-up, and whether the capture held:
    where it fails, the calls are made eagerly, back to back."""
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(reps):
                fn(i)
        return graph.replay, True
    except Exception:  # noqa: BLE001 - not capturable: time eager launches back to back
        def run() -> None:
            for i in range(reps):
                fn(i)
        return run, False


def seconds_per_call(run: Callable[[], None], reps: int) -> float:
    """One run() of `reps` calls timed between events, median of 5 after a first, per call."""
    run()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / reps)
    return statistics.median(times)


def _time(fn: Callable[[int], None], reps: int = 20) -> float:
    """Seconds of one fn(i) on the GPU: `reps` calls (i rotating the inputs) captured in one CUDA
    graph, median of 5 replays / reps. A graph, because the engine's decode steps are graphs, and
    an eager launch timed alone between two events measures mostly its host launch (a Triton
    launch from Python costs tens of µs, more than the kernels here): the first probe said 83 µs
    for an add_rms_norm that the step's profile shows at 2 µs. Falls back to eager, back to back,
    where capture fails."""
    return seconds_per_call(graph_runner(fn, reps)[0], reps)


def _attention_inputs(n: int, context: int, copies: int = 2) -> dict:
    blocks_per = -(-context // BS)
    num_blocks = n * blocks_per + 8
    gen = torch.Generator().manual_seed(n)
    caches = [(torch.randn(num_blocks, BS, KV_HEADS, DIM, device="cuda", dtype=torch.bfloat16),
               torch.randn(num_blocks, BS, KV_HEADS, DIM, device="cuda", dtype=torch.bfloat16))
              for _ in range(copies)]
    tables = torch.randperm(num_blocks, generator=gen)[:n * blocks_per].view(n, blocks_per)
    return {"q": torch.randn(n, HEADS, DIM, device="cuda", dtype=torch.bfloat16), "caches": caches,
            "tables": tables.to(torch.int32).cuda(), "lens": torch.full((n,), context, dtype=torch.int32,
                                                                        device="cuda"),
            "starts": torch.arange(n + 1, dtype=torch.int32, device="cuda")}


def attention(n: int, context: int, config: tuple | None = None, once: bool = False) -> float:
    """Seconds of one decode attention launch (with its merge) of n sequences."""
    from paged_kernels import paged_attention as pa

    a = _attention_inputs(n, context)
    splits = None
    pa.CONFIG_OVERRIDE = None
    if config is not None:
        block_n, warps, stages, splits = config
        pa.CONFIG_OVERRIDE = {"block_n": block_n, "num_warps": warps, "num_stages": stages}

    def run(i: int) -> None:
        k, v = a["caches"][i % len(a["caches"])]
        pa.paged_attention(a["q"], k, v, a["tables"], a["lens"], a["starts"], DIM ** -0.5,
                           max_query_len=1, max_seq_len=context, num_splits=splits)

    try:
        if once:
            run(0)
            return 0.0
        return _time(run)
    finally:
        pa.CONFIG_OVERRIDE = None


def projections(hidden: int, qkv: int, mlp: int, vocab: int) -> list[tuple[str, int, int]]:
    """(name, out features, in features) of a decode step's matmuls, in the order a layer runs
    them, then the LM head."""
    return [("qkv", qkv, hidden), ("o_proj", hidden, hidden), ("gate_up", 2 * mlp, hidden),
            ("down", hidden, mlp), ("lm_head", vocab, hidden)]


def rotated_weights(out_f: int, in_f: int) -> list[torch.Tensor]:
    """Copies of a [out_f, in_f] bfloat16 weight, together past the 50 MB L2: a probe that
    rotates among them reads memory, as a step reads its layers, not the cache."""
    copies = max(2, (64 << 20) // (out_f * in_f * 2) + 1)
    return [torch.randn(out_f, in_f, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]


def _linear(n: int, out_f: int, in_f: int, once: bool) -> float:
    ws = rotated_weights(out_f, in_f)
    x = torch.randn(n, in_f, device="cuda", dtype=torch.bfloat16)

    def run(i: int) -> None:
        torch.nn.functional.linear(x, ws[i % len(ws)])

    if once:
        run(0)
        return 0.0
    return _time(run)


def layer_kernels(n: int, context: int, once: bool = False) -> list[dict]:
    """Each launch kind of a decode step of n sequences: seconds, bytes it must move, GB/s."""
    from paged_kernels import layer_ops

    rows = []
    kv = n * context * KV_HEADS * DIM * 2 * 2
    rows.append({"kernel": "paged attention (+ merge)", "s": attention(n, context, once=once),
                 "bytes": kv})
    for name, o, i in projections(HIDDEN, (HEADS + 2 * KV_HEADS) * DIM, MLP, VOCAB):
        rows.append({"kernel": name, "s": _linear(n, o, i, once), "bytes": o * i * 2 + n * (o + i) * 2})
    x = torch.randn(n, HIDDEN, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16)
    gu = torch.randn(n, 2 * MLP, device="cuda", dtype=torch.bfloat16)
    for name, fn, nbytes in (
            ("add_rms_norm", lambda i: layer_ops.add_rms_norm(x, x, w, 1e-5), 4 * n * HIDDEN * 2),
            ("silu_and_mul", lambda i: layer_ops.silu_and_mul(gu), 3 * n * MLP * 2)):
        if once:
            fn(0)
        rows.append({"kernel": name, "s": 0.0 if once else _time(fn), "bytes": nbytes})
    for r in rows:
        r["us"] = round(1e6 * r.pop("s"), 2)
        r["gb_s"] = round(r["bytes"] / r["us"] / 1e3, 1) if r["us"] else None
    return rows


def sweep(n: int, context: int) -> list[dict]:
    """The decode attention under each configuration of SWEEP, fastest first."""
    rows = []
    for config in SWEEP:
        try:
            us = 1e6 * attention(n, context, config)
        except Exception as err:  # noqa: BLE001 - a configuration that does not compile
            rows.append({"config": config, "error": f"{type(err).__name__}: {err}"[:160]})
            continue
        rows.append({"config": config or "heuristic", "us": round(us, 2)})
    return sorted(rows, key=lambda r: r.get("us", float("inf")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--context", type=int, default=560)
    ap.add_argument("--once", action="store_true", help="each launch once (under ncu)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    result = {}
    for n in args.seqs:
        result[str(n)] = {"kernels": layer_kernels(n, args.context, args.once)}
        if not args.once:
            result[str(n)]["attention_sweep"] = sweep(n, args.context)
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
