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
