"""The README's GPU table is the output of bench/report.py over the committed results."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_gpu_table_is_generated_from_the_results():
    spec = importlib.util.spec_from_file_location("report", ROOT / "bench" / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index(report.BEGIN) + len(report.BEGIN): readme.index(report.END)]
    assert block.strip() == report.table().strip(), (
        "README's GPU table differs from the results: run `python bench/report.py --write`")


def test_every_serving_target_of_the_suite_is_in_the_table():
    """Issue 13's targets each have a row, computed from the committed suite and host results."""
    spec = importlib.util.spec_from_file_location("report", ROOT / "bench" / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    text = report.table()
    for target in ("sampled decode step", "256 ragged requests, greedy", "256 ragged requests, sampled",
                   "roofline at 64 and 256", "8,000-token", "first batch after start",
                   "CPU: dry step", "CPU: sampled step"):
        assert target in text, target


def test_the_bound_of_the_rows_left_counts_only_matmuls_and_attention():
    """The README's bound sums the attention's and cuBLAS's kernels of a profile, nothing else."""
    spec = importlib.util.spec_from_file_location("report_turns", ROOT / "bench" / "report_turns.py")
    turns = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(turns)

    def step(attention: float, gemm: float) -> list[dict]:
        return [{"all_kernels_ms": 9.0, "launches": 99}, {"kernel": "_paged_attn_kernel", "ms": attention},
                {"kernel": "nvjet_sm90_tst_64x8", "ms": gemm}, {"kernel": "_add_rms_norm_kernel", "ms": 5.0},
                {"kernel": "void cublasLt::splitKreduce_kernel<32>", "ms": 0.1}]

    def model(attention: float) -> dict:
        return {"kernels": step(attention, 1.0), "prefill_profile": {"top": [
            {"name": k["kernel"], "ms": 2 * k["ms"]} for k in step(attention, 1.0)[1:]]}}

    run = {"roofline": {"64": {"roofline_ms": 1.1, "kernels": step(0.5, 0.6)},
                        "256": {"roofline_ms": 2.0, "kernels": step(1.5, 1.0)}},
           "hybrid": {"4096": {"hybrid": model(0.4), "full": model(0.9)}}}
    said = turns.matmuls_and_attention(run)
    assert "1.09x its roofline at 64 sequences and 1.30x at 256" in said, said
    assert "decode step 1.33x as fast as the full model's, its prefill 1.33x" in said, said
    assert turns.matmuls_and_attention({"roofline": {}}) == ""
