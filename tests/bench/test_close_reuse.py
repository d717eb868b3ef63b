"""bench/close_reuse.py's CPU smoke mode: the script runs, the first engine's pool is gone after
close() with the GC off, and a second engine of the same size serves the same tokens (the GPU
numbers come from running it on a GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_close_reuse_smoke(tmp_path):
    out = tmp_path / "close_reuse.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "close_reuse.py"), "--smoke",
                           "--max-tokens", "4", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["ok"] and result["gc"] == "disabled"
    assert result["first"]["kv_pool_alive_after_close"] is False
    assert result["second"]["same_tokens_as_first"]
    assert result["second"]["num_gpu_blocks"] == result["first"]["num_gpu_blocks"]
