"""Is there a cuBLAS algorithm faster than the one `F.linear` gets, for the decode steps'
projections? PyTorch's TunableOp (torch.cuda.tunable) times every implementation it registers for
a GEMM's shape and keeps the fastest: on CUDA the default cuBLAS call and, where the build
registers them, the cuBLASLt heuristic's candidates. The three rows of issue 44 left are bound by
these matmuls (bench/report_turns.matmuls_and_attention), so this is the library's last lever.

Each projection of a decode step is timed inside a CUDA graph, weights rotated among copies
larger than the L2 cache (as the engine's layers are read), first as the engine calls it, then
with TunableOp tuned for that shape. The implementation it chose is recorded (with
PYTORCH_TUNABLEOP_VERBOSE=3 it prints every candidate it timed), and the tuned output is compared
with the default's.

    python bench/gemm_tunable_probe.py "$OUT/gemm_tunable_probe.json"      # a GPU
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.kernel_probe import graph_runner, projections, rotated_weights, seconds_per_call  # noqa: E402

SHAPES = (  # (model, rows, hidden, qkv features, MLP features, vocabulary)
    ("SmolLM2 x 32", 32, 576, 960, 1536, 49152),
    ("1.2B x 64", 64, 2048, 3072, 8192, 49152),
    ("1.2B x 256", 256, 2048, 3072, 8192, 49152),
)


def time_in_graph(fn, reps: int = 20) -> tuple[float, bool]:
    """Microseconds of one fn(i) (i rotates the weights), and whether a CUDA graph held them."""
    run, captured = graph_runner(fn, reps)
    return round(1e6 * seconds_per_call(run, reps), 2), captured


def tuned_ops(signature_part: str) -> list[str]:
    """The implementations TunableOp chose for GEMMs whose key names this size."""
    return [f"{op} {key} -> {choice}" for op, key, choice, *_ in torch.cuda.tunable.get_results()
            if signature_part in key]


def probe_one(name: str, rows: int, out_f: int, in_f: int) -> dict:
    x = torch.randn(rows, in_f, device="cuda", dtype=torch.bfloat16)
    ws = rotated_weights(out_f, in_f)
    copies = len(ws)
    want = F.linear(x, ws[0]).float()
    default_us, default_graph = time_in_graph(lambda i: F.linear(x, ws[i % copies]))
    tunable = torch.cuda.tunable
    tunable.enable(True)
    tunable.tuning_enable(True)
    try:
        got = F.linear(x, ws[0]).float()  # tunes this shape, every candidate timed
        tunable.tuning_enable(False)
        tuned_us, tuned_graph = time_in_graph(lambda i: F.linear(x, ws[i % copies]))
    finally:
        tunable.tuning_enable(False)
        tunable.enable(False)
    err = float((got - want).abs().max() / want.abs().max())
    return {"projection": name, "rows": rows, "out": out_f, "in": in_f,
            "weight_mb": round(out_f * in_f * 2 / 1e6, 2),
            "default_us": default_us, "tuned_us": tuned_us, "graphs": [default_graph, tuned_graph],
            "tuned_over_default": round(tuned_us / default_us, 3), "max_rel_diff": round(err, 5),
            "default_tb_s": round(out_f * in_f * 2 / default_us / 1e6, 2),
            "tuned_tb_s": round(out_f * in_f * 2 / tuned_us / 1e6, 2),
            "chosen": tuned_ops(f"_{out_f}_{rows}_{in_f}") + tuned_ops(f"_{rows}_{out_f}_{in_f}")}


def main(path: str) -> None:
    if not torch.cuda.is_available():
        sys.exit("bench/gemm_tunable_probe.py times cuBLAS: it needs a CUDA GPU")
    tunable = torch.cuda.tunable
    tunable.set_filename(os.path.join(tempfile.mkdtemp(), "tunableop_results%d.csv"))
    tunable.set_max_tuning_duration(200)  # ms a shape: every candidate gets its reps
    tunable.set_rotating_buffer_size(256)  # MB: candidates timed on cold inputs, as in a step
    rows_out = []
    for model, rows, hidden, qkv, mlp, vocab in SHAPES:
        for name, out_f, in_f in projections(hidden, qkv, mlp, vocab):
            row = {"shape": model, **probe_one(name, rows, out_f, in_f)}
            rows_out.append(row)
            print(json.dumps(row), flush=True)
    step = {}
    for model, *_ in SHAPES:  # a step's matmuls once each (the model's layers multiply them)
        mine = [r for r in rows_out if r["shape"] == model]
        step[model] = {"default_us": round(sum(r["default_us"] for r in mine), 2),
                       "tuned_us": round(sum(r["tuned_us"] for r in mine), 2)}
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "cublaslt_env": os.environ.get("PYTORCH_TUNABLEOP_CUBLASLT_ENABLED"),
                   "rows": rows_out, "one_of_each": step,
                   "results": [[str(v) for v in r] for r in tunable.get_results()]}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gemm_tunable_probe.json")
