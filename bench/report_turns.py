"""Sentences of the README's issue 44 paragraph, from committed results: the host's speed as each
part of a run began (bench/host_speed.py's loop), where the graph figures of the run beside it were
read, and what bounds the rows left. Each returns "" when its result is not there; bench/report.py
puts them after the table's caption. The runs between (by turns, parts again) are read in
bench/NOTES.md."""

from __future__ import annotations

import json
import os

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


#: bench/host_speed.py's loop between its two values (~1.6-2.0 ms fast, 3.4-4.5 ms slow)
SLOW_LOOP_MS = 2.7

def _load(name: str) -> dict | None:
    path = os.path.join(RESULTS, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def host_speed_at_parts(run: dict) -> str:
    """A run's host speed as each part began (its fixed loop), slow or fast."""
    speed = {k: v for k, v in run.get("python_ms", {}).items() if k in
             ("rejects", "hybrid", "tier", "roofline")}
    if not speed:
        return ""
    fast = [k for k, ms in speed.items() if ms <= SLOW_LOOP_MS]
    slow = [k for k in speed if k not in fast]
    said = "; ".join(f"{k} {speed[k]:.2f} ms" for k in speed)
    if not slow or not fast:
        which = f"every one at the {'fast' if fast else 'slow'} speed"
    else:
        which = f"{', '.join(slow)} at the slow speed, {', '.join(fast)} at the fast one"
    return (f" In that run the host's loop (`bench/host_speed.py`) took {said} as the parts "
            f"began: {which}.")


def graph_mid_run() -> str:
    """Run 67: where a decode graph is replayed changes its time; the earlier runs' graph figures
    were read on the inputs their run ended with."""
    gaps = _load("replay_gaps_run67c.json")
    if gaps is None:
        return ""
    g256 = gaps["256"]
    mid = g256["alone_mid_run_ms"]
    return (" Run 56 replayed its graphs on the inputs its run ended with, where run 67 "
            "(`replay_gaps_run67c.json`) found the 256-sequence graph faster than anywhere in "
            f"the engine's loop: {g256['alone_ms']:.2f} ms there, {min(mid):.2f}-{max(mid):.2f} "
            f"ms alone on a steady step's inputs, {g256['in_loop']['replay_ms']:.2f} ms a "
            "replay in the loop. Since then `bench/device_step.py` probes the graph mid-run, as "
            "run 73's figures are.")


def kernel_bound(run: dict) -> str:
    """What bounds the rows left (runs 71-73): the step is its graph's, the graph its kernels',
    and neither lever tried moved the kernels."""
    layout, fused = _load("layout_probe_run71.json"), _load("norm_linear_probe_run72.json")
    roof = run.get("roofline", {}).get("64")
    if layout is None or fused is None or not roof or not roof.get("kernels"):
        return ""
    kernels = roof["kernels"]
    attention, gemms = _attention_ms(kernels[1:]), _cublas_ms(kernels[1:])
    heur = {(r["shape"], r["layout"]): r["us"] for r in layout["rows"]
            if r.get("config") == "heuristic" and r.get("block_size") == 16}
    gains = [100 * (1 - heur[(shape, "HND")] / heur[(shape, "NHD")])
             for shape in {s for s, _ in heur}]

    def pair(shape: str, part: str) -> str:
        row = next(r for r in fused["rows"] if r["shape"] == shape and r["part"] == part)
        best = min(v[0] for v in row["fused_us"].values() if isinstance(v, list))
        return f"{best:.1f} against {row['separate_us']:.1f} µs"

    return (f" What bounds the three rows left: at 64 sequences the step is its graph "
            f"({roof['graph_over_roofline']}x the roofline), and the graph its "
            f"{kernels[0]['launches']} kernels ({kernels[0]['all_kernels_ms']:.2f} ms: the "
            f"attention {attention:.2f}, cuBLAS's matmuls {gemms:.2f}, the LM head's "
            "included). Two levers were measured and left: the cache laid out head by head, "
            "which made the decode "
            f"attention {min(gains):.1f}-{max(gains):.1f}% faster (run 71, "
            "`layout_probe_run71.json`), and each norm folded into the projection after it, "
            "which made every pair slower (run 72, `norm_linear_probe_run72.json`: norm + qkv "
            f"{pair('SmolLM2 x 32', 'norm + qkv')} at SmolLM2's shapes, "
            f"{pair('1.2B x 64', 'norm + qkv')} at the 1.2B's).") + matmuls_and_attention(run)


def _attention_ms(kernels: list[dict]) -> float:
    """The paged attention's time in a profile's kernel list."""
    return sum(k["ms"] for k in kernels if k.get("kernel") == "_paged_attn_kernel")


def _cublas_ms(kernels: list[dict]) -> float:
    """cuBLAS's kernels' time (the matmuls, the LM head's, split-K's reduce)."""
    return sum(k["ms"] for k in kernels
               if "nvjet" in k.get("kernel", "") or "splitK" in k.get("kernel", ""))


def _big_kernels_ms(kernels: list[dict]) -> float:
    """The attention's and cuBLAS's kernels together."""
    return _attention_ms(kernels) + _cublas_ms(kernels)


def matmuls_and_attention(run: dict) -> str:
    """How far the rows left could go were a step nothing but its matmuls and attention, each at
    the speed the run's profile measured: no norm, RoPE, SiLU, gap between kernels or host."""
    roof, hybrid = run.get("roofline", {}), run.get("hybrid", {}).get("4096", {})
    if not all(roof.get(n, {}).get("kernels") for n in ("64", "256")) or "full" not in hybrid:
        return ""
    over = {n: _big_kernels_ms(roof[n]["kernels"][1:]) / roof[n]["roofline_ms"] for n in ("64", "256")}

    def ratio(kernels_of) -> float:
        return _big_kernels_ms(kernels_of(hybrid["full"])) / _big_kernels_ms(kernels_of(hybrid["hybrid"]))

    decode = ratio(lambda m: m["kernels"][1:])
    prefill = ratio(lambda m: [{"kernel": k["name"], "ms": k["ms"]} for k in m["prefill_profile"]["top"]])
    return (" Were a step nothing but those matmuls and the attention, at the speeds run 73 "
            "measured (no norm, RoPE, SiLU, gap between kernels or host), the 1.2B step would be "
            f"{over['64']:.2f}x its roofline at 64 sequences and {over['256']:.2f}x at 256, and at "
            f"4,096 tokens the hybrid's decode step {decode:.2f}x as fast as the full model's, "
            f"its prefill {prefill:.2f}x: the rows left need matmuls faster than cuBLAS's at these "
            "sizes (and, for the roofline, an attention nearer the memory's speed) with next to "
            "nothing else in a step." + _tunable())


def _tunable() -> str:
    """Run 74: TunableOp, the library's own search, on the decode projections."""
    probe = _load("gemm_tunable_probe_run74.json")
    if probe is None:
        return ""
    ratios = [r["tuned_over_default"] for r in probe["rows"]]
    chosen = {c.rsplit("-> ", 1)[-1] for r in probe["rows"] for c in r["chosen"]}
    return (f" PyTorch's TunableOp (run 74, `gemm_tunable_probe_run74.json`) chose "
            f"{' / '.join(f'`{c}`' for c in sorted(chosen))} (the plain cuBLAS call) for every "
            f"projection, {min(ratios):.3f}-{max(ratios):.3f}x its time: on torch {probe['torch']} "
            "it has no other algorithm to try (`gemm_tunable_candidates_run74.log`).")
