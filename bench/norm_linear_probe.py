"""The norm folded into the projection after it (paged_kernels/norm_linear.py) against the
separate kernels it replaces, on the GPU: `add_rms_norm` then the qkv matmul, and `add_rms_norm`
then the gate/up matmul then `silu_and_mul`, each sequence timed inside a CUDA graph
(bench/kernel_probe.py's `_time`), weights rotated among copies larger than the L2 cache.

Shapes: a SmolLM2-135M layer at 32 sequences (the hybrid row's decode), a Llama-3.2-1B-shaped
layer at 64 and 256 (the roofline rows; 256 is past MAX_FUSED_ROWS and is timed through the
kernel directly, to see where the fused kernel stops paying). Each fused launch's tiles are swept;
the outputs are compared with the separate kernels' (bfloat16: the matmul's order differs).

    python bench/norm_linear_probe.py "$OUT/norm_linear_probe.json"      # a GPU
"""
from __future__ import annotations

import json
import os
import sys

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.kernel_probe import _time  # noqa: E402

SHAPES = (  # (name, rows, hidden, qkv features, MLP features)
    ("SmolLM2 x 32", 32, 576, 960, 1536),
    ("1.2B x 64", 64, 2048, 3072, 8192),
    ("1.2B x 256", 256, 2048, 3072, 8192),
)
#: None: the kernel's default tile; else (block_n, block_k, num_warps, num_stages)
CONFIGS = (None, (16, 64, 4, 3), (32, 64, 4, 3), (64, 64, 4, 3), (16, 128, 4, 3),
           (32, 128, 4, 4), (64, 128, 8, 3), (32, 64, 2, 4))


def _weights(out_f: int, hidden: int) -> list[torch.Tensor]:
    copies = max(2, (64 << 20) // (out_f * hidden * 2) + 1)  # together past the 50 MB L2
    return [torch.randn(out_f, hidden, device="cuda", dtype=torch.bfloat16) * 0.02
            for _ in range(copies)]


def _separate(ops, silu: bool, x, res, nw, ws):
    def run(i: int):
        normed, summed = ops.add_rms_norm(x, res, nw, 1e-5)
        out = torch.nn.functional.linear(normed, ws[i % len(ws)])
        return (ops.silu_and_mul(out) if silu else out), summed
    return run


def _fused(nl, silu: bool, x, res, nw, ws, config):
    def run(i: int):
        nl.CONFIG_OVERRIDE = None if config is None else dict(
            zip(("block_n", "block_k", "num_warps", "num_stages"), config, strict=True))
        try:
            return nl._launch(x, res, nw, 1e-5, ws[i % len(ws)], None, silu)
        finally:
            nl.CONFIG_OVERRIDE = None
    return run


def probe(name: str, rows: int, hidden: int, qkv: int, mlp: int) -> list[dict]:
    from paged_kernels import layer_ops
    from paged_kernels import norm_linear as nl

    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    nw = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(torch.bfloat16)
    out = []
    for part, out_f, silu in (("norm + qkv", qkv, False), ("norm + gate_up + silu", 2 * mlp, True)):
        ws = _weights(out_f, hidden)
        separate = _separate(layer_ops, silu, x, res, nw, ws)
        want = separate(0)[0].float()
        row = {"shape": name, "part": part, "weight_mb": round(out_f * hidden * 2 / 1e6, 2),
               "separate_us": round(1e6 * _time(separate), 2), "fused_us": {}}
        for config in CONFIGS:
            fused = _fused(nl, silu, x, res, nw, ws, config)
            key = "default" if config is None else str(config)
            try:
                got = fused(0)[0].float()
                err = float((got - want).abs().max() / want.abs().max())
                row["fused_us"][key] = [round(1e6 * _time(fused), 2), round(err, 5)]
            except Exception as e:  # noqa: BLE001 - a tile that does not compile
                row["fused_us"][key] = f"{type(e).__name__}: {e}"[:120]
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def main(path: str) -> None:
    rows = [row for shape in SHAPES for row in probe(*shape)]
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "norm_linear_probe.json")
