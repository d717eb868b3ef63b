"""The decode attention's split-K count for few sequences over a long context, swept on the GPU:
a sequence alone over 4,096 keys is 8 programs of the Llama-3.2-1B shape (8 KV heads), and the
heuristic (`paged_kernels.attention_config.choose_num_splits`) never slices under 256 keys, so it
runs 16 splits there. Each count below, and the heuristic's, timed inside a CUDA graph
(bench/kernel_probe.py's `_time`), for 1-16 sequences, one query each or eight (the rest of a
prompt after a prefix came back from the CPU tier).

    python bench/split_probe.py "$OUT/split_probe.json"      # a GPU
"""
from __future__ import annotations

import json
import os
import sys

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.kernel_probe import DIM, HEADS, KV_HEADS, _attention_inputs, _time  # noqa: E402

SPLITS = (None, 1, 4, 8, 16, 32, 64)  # None: the heuristic's


def probe(n: int, context: int, q: int) -> dict:
    from paged_kernels import paged_attention as pa

    a = _attention_inputs(n, context)  # the probe's pool, tables and lengths; q queries each
    query = torch.randn(n * q, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    starts = a["starts"] * q
    got = {}
    for splits in SPLITS:
        def run(i: int, splits: int | None = splits) -> None:
            k, v = a["caches"][i % len(a["caches"])]
            pa.paged_attention(query, k, v, a["tables"], a["lens"], starts, DIM ** -0.5,
                               max_query_len=q, max_seq_len=context, num_splits=splits)
        try:
            got[str(splits or "heuristic")] = round(1e6 * _time(run), 2)
        except Exception as err:  # noqa: BLE001 - a count the kernel refuses
            got[str(splits or "heuristic")] = f"{type(err).__name__}: {err}"[:120]
    kv_mb = 2 * n * context * KV_HEADS * DIM * 2 / 1e6
    return {"seqs": n, "context": context, "queries": q, "kv_mb": round(kv_mb, 1), "us": got}


def main(path: str) -> None:
    rows = [probe(n, ctx, q) for q in (1, 8) for n, ctx in
            ((1, 4100), (2, 4100), (4, 4100), (8, 4100), (16, 4100), (1, 1024), (1, 16384))]
    for row in rows:
        print(json.dumps(row), flush=True)
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "split_probe.json")
