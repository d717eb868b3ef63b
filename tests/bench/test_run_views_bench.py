"""bench/run_views.py's smoke mode: the redraw bench of the views of the run still runs end to
end and writes its JSON (the committed numbers come from its full run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_run_views_bench_smoke(tmp_path):
    out = tmp_path / "run_views.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run_views.py"), "--smoke",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["smoke"] and result["run"]["engine_steps"] > 10
    for key in ("timeline", "memory", "prefix_tree"):
        for where in ("presenter_1280x720", "laptop_1440x900", "phone_390"):
            row = result[f"{key}_{where}"]["back_next"]
            assert row["redraws"] > 0 and row["median_ms"] > 0 and row["json_kb_max"] > 0
