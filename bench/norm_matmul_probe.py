"""Is a norm folded into the matmul after it faster than the two launches it replaces? The lean
decoder's two pairs, timed on a decode step's shapes inside CUDA graphs (bench/kernel_probe.py's
`_time`): add_rms_norm then the qkv matmul against `norm_linear`, and add_rms_norm, the gate/up
matmul and silu_and_mul against `norm_gate_up_silu` (paged_kernels/norm_matmul.py).

    python bench/norm_matmul_probe.py --out "$OUT/norm_matmul_probe.json"     # on a GPU

SmolLM2-135M's shapes (hidden 576, qkv 960, MLP 1536) and Llama-3.2-1B's (2048, 3072, 8192),
bfloat16, random weights rotated among copies larger than the L2 cache (a timing reads memory).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.kernel_probe import _time  # noqa: E402

#: name: (hidden, qkv columns, MLP width)
SHAPES = {"smollm2-135m": (576, 960, 1536), "llama-3.2-1b": (2048, 3072, 8192)}
L2_BYTES = 50 * 2 ** 20


def _copies(*shape: int) -> list[torch.Tensor]:
    """Enough random copies of a bfloat16 weight that, cycled, they do not fit in L2."""
    n = min(max(2, -(-2 * L2_BYTES // (2 * torch.Size(shape).numel()))), 64)
    return [torch.randn(*shape, device="cuda", dtype=torch.bfloat16) / shape[-1] ** 0.5
            for _ in range(n)]


def pair(rows: int, hidden: int, qkv: int, mlp: int) -> dict:
    """µs of each way, qkv side and MLP side, for one step of `rows` tokens."""
    from paged_kernels import layer_ops
    from paged_kernels.norm_matmul import norm_gate_up_silu, norm_linear

    F = torch.nn.functional
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    res = torch.randn_like(x)
    norm_w = 1 + 0.1 * torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    w_qkv = _copies(qkv, hidden)
    w_gu = _copies(2 * mlp, hidden)

    def qkv_apart(i: int) -> None:
        normed, _ = layer_ops.add_rms_norm(x, res, norm_w, 1e-5)
        F.linear(normed, w_qkv[i % len(w_qkv)])

    def qkv_fused(i: int) -> None:
        norm_linear(x, res, norm_w, 1e-5, w_qkv[i % len(w_qkv)])

    def mlp_apart(i: int) -> None:
        normed, _ = layer_ops.add_rms_norm(x, res, norm_w, 1e-5)
        layer_ops.silu_and_mul(F.linear(normed, w_gu[i % len(w_gu)]))

    def mlp_fused(i: int) -> None:
        norm_gate_up_silu(x, res, norm_w, 1e-5, w_gu[i % len(w_gu)])

    got = {name: round(_time(fn, reps=64) * 1e6, 2) for name, fn in
           (("qkv_apart_us", qkv_apart), ("qkv_fused_us", qkv_fused),
            ("mlp_apart_us", mlp_apart), ("mlp_fused_us", mlp_fused))}
    weight_bytes = 2 * hidden * (qkv + 2 * mlp)
    both = got["qkv_fused_us"] + got["mlp_fused_us"]
    got["fused_weights_TB_s"] = round(weight_bytes / both / 1e6, 2)
    got["saved_us"] = round(got["qkv_apart_us"] + got["mlp_apart_us"] - both, 2)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 32, 64, 256])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    table: dict = {}
    for name, shape in SHAPES.items():
        for rows in args.rows:
            try:
                got = pair(rows, *shape)
            except Exception as err:  # noqa: BLE001 - a shape that fails says why, the rest still run
                got = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
            table.setdefault(name, {})[rows] = got
            print(f"{name:13} rows {rows:4}: {got}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "us": table}, f, indent=1)


if __name__ == "__main__":
    main()
