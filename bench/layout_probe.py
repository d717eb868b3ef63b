"""Does the decode attention read faster when a block keeps each KV head's tokens together?

The pool lays a block out as [block_size, kv_heads, head_dim] (tokens, then heads: "NHD"), so a
program of the decode attention, which reads one KV head, reads 128-byte rows (head_dim 64 in
bfloat16) spaced kv_heads * 128 bytes apart. Laid out [kv_heads, block_size, head_dim] ("HND"),
the same program reads block_size * 128 contiguous bytes a block. The kernel takes strides, so
both layouts run the same kernel: the HND pool is passed as a transposed view.

For each shape (the 1.2B roofline rows: 8 KV heads, 64 and 256 sequences over 512 keys; the
hybrid row's full layers: SmolLM2's 3 KV heads, 32 sequences over 4,096 keys), each layout and
block size, the launch is timed inside a CUDA graph (bench/kernel_probe.py's `_time`), and its
output compared with the NHD one's (the same values must come out: same kernel, same order).

    python bench/layout_probe.py "$OUT/layout_probe.json"      # a GPU
"""
from __future__ import annotations

import json
import os
import sys

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.kernel_probe import _time, rotated_weights  # noqa: E402

DIM = 64
SHAPES = (  # (name, sequences, context, q heads, kv heads)
    ("1.2B x 64", 64, 512, 32, 8),
    ("1.2B x 256", 256, 512, 32, 8),
    ("SmolLM2 x 32 @ 4,096", 32, 4096, 9, 3),
)
#: None: the heuristic's tile; else (block_n, num_warps, num_stages)
CONFIGS = (None, (64, 4, 3), (128, 4, 2), (128, 8, 3), (32, 4, 4))


def _inputs(n: int, context: int, heads: int, kv_heads: int, bs: int, hnd: bool) -> dict:
    blocks_per = -(-context // bs)
    num_blocks = n * blocks_per + 8
    gen = torch.Generator(device="cuda").manual_seed(7)
    copies = []
    for _ in range(2):  # rotated, so a timing reads memory, not the 50 MB L2
        pair = []
        for _ in range(2):
            nhd = torch.randn(num_blocks, bs, kv_heads, DIM, device="cuda", dtype=torch.bfloat16,
                              generator=gen)
            pair.append(nhd.transpose(1, 2).contiguous().transpose(1, 2) if hnd else nhd)
        copies.append(tuple(pair))
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(n))
    tables = perm[:n * blocks_per].view(n, blocks_per).to(torch.int32).cuda()
    q = torch.randn(n, heads, DIM, device="cuda", dtype=torch.bfloat16,
                    generator=torch.Generator(device="cuda").manual_seed(3))
    return {"q": q, "caches": copies, "tables": tables,
            "lens": torch.full((n,), context, dtype=torch.int32, device="cuda"),
            "starts": torch.arange(n + 1, dtype=torch.int32, device="cuda")}


def _run(a: dict, context: int, config: tuple | None, i: int) -> torch.Tensor:
    from paged_kernels import paged_attention as pa

    pa.CONFIG_OVERRIDE = None if config is None else dict(zip(("block_n", "num_warps",
                                                               "num_stages"), config, strict=True))
    try:
        k, v = a["caches"][i % 2]
        return pa.paged_attention(a["q"], k, v, a["tables"], a["lens"], a["starts"], DIM ** -0.5,
                                  max_query_len=1, max_seq_len=context)
    finally:
        pa.CONFIG_OVERRIDE = None


def probe(name: str, n: int, context: int, heads: int, kv_heads: int) -> list[dict]:
    rows = []
    kv_bytes = 2 * n * context * kv_heads * DIM * 2
    for bs in (16, 32):
        outs = {}
        for hnd in (False, True):
            a = _inputs(n, context, heads, kv_heads, bs, hnd)
            outs[hnd] = _run(a, context, None, 0).float()
            for config in CONFIGS:
                try:
                    us = 1e6 * _time(lambda i, a=a, c=config: _run(a, context, c, i))
                    row = {"us": round(us, 2), "tb_s": round(kv_bytes / us / 1e6, 2)}
                except Exception as err:  # noqa: BLE001 - a configuration that does not compile
                    row = {"error": f"{type(err).__name__}: {err}"[:160]}
                rows.append({"shape": name, "block_size": bs, "layout": "HND" if hnd else "NHD",
                             "config": config or "heuristic", **row})
                print(json.dumps(rows[-1]), flush=True)
            del a
        same = bool(torch.equal(outs[False], outs[True]))
        rows.append({"shape": name, "block_size": bs, "outputs_equal": same})
        print(json.dumps(rows[-1]), flush=True)
    return rows


#: (name, rows, out_features, in_features): the decode step's projections
LINEARS = tuple((f"{model} {proj} x {m}", m, o, i)
                for model, m_list, shapes in (
                    ("1.2B", (64, 256), {"qkv": (3072, 2048), "o_proj": (2048, 2048),
                                         "gate_up": (16384, 2048), "down": (2048, 8192)}),
                    ("SmolLM2", (32,), {"qkv": (960, 576), "o_proj": (576, 576),
                                        "gate_up": (3072, 576), "down": (576, 1536)}))
                for m in m_list for proj, (o, i) in shapes.items())


def _gemm(name: str, m: int, o: int, i: int) -> dict:
    ws = rotated_weights(o, i)
    copies = len(ws)
    wts = [w.t().contiguous() for w in ws]
    x = torch.randn(m, i, device="cuda", dtype=torch.bfloat16)

    def linear(k: int) -> None:
        torch.nn.functional.linear(x, ws[k % copies])

    def transposed(k: int) -> None:
        torch.matmul(x, wts[k % copies])

    row = {"linear": name, "weight_mb": round(o * i * 2 / 1e6, 2),
           "linear_us": round(1e6 * _time(linear), 2),
           "x @ w_t_us": round(1e6 * _time(transposed), 2)}
    try:
        torch.backends.cuda.preferred_blas_library("cublaslt")
        row["linear_cublaslt_us"] = round(1e6 * _time(linear), 2)
    except Exception as err:  # noqa: BLE001 - a torch without the switch
        row["linear_cublaslt_us"] = f"{type(err).__name__}: {err}"[:120]
    finally:
        torch.backends.cuda.preferred_blas_library("cublas")
    return row


def gemms() -> list[dict]:
    """Each projection as F.linear (the engine's: x @ W.T, cuBLAS's choice), with cuBLASLt
    preferred, and as x @ W stored transposed: which kernels the library picks differs."""
    rows = []
    for shape in LINEARS:
        rows.append(_gemm(*shape))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(path: str) -> None:
    rows = [row for shape in SHAPES for row in probe(*shape)]
    out = {"device": torch.cuda.get_device_name(), "rows": rows, "gemms": gemms()}
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "layout_probe.json")
