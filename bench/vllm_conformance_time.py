"""The time the vLLM tests (tests/vllm: conformance, hashes, the live watch) add to the suite,
vLLM's start included: runs them as the suite does and times the run. Writes
bench/results/vllm_conformance_time.json with pytest's slowest parts and the machine's load, and
pytest's report beside it (.log).

    .venv/bin/python bench/vllm_conformance_time.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    default = ROOT / "bench" / "results" / "vllm_conformance_time.json"
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    load = os.getloadavg()
    rows = out.with_suffix(".workloads.jsonl")
    rows.unlink(missing_ok=True)
    t = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "pytest", "tests/vllm", "-v", "--durations=0", "-p",
                          "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PAGEDLAB_VLLM_RECORD": str(rows)})
    wall = time.perf_counter() - t
    out.with_suffix(".log").write_text(run.stdout + run.stderr)  # the tests' own report
    tail = run.stdout.strip().splitlines()
    durations = [line for line in tail if re.match(r"^\d+\.\d+s (setup|call|teardown)", line)]
    result = {"wall_s": round(wall, 1), "exit_code": run.returncode, "summary": tail[-1],
              "load_before": load, "load_after": os.getloadavg(), "machine": f"{os.cpu_count()} cores",
              "durations": durations[:20],
              "workloads": [json.loads(line) for line in rows.read_text().splitlines()]
              if rows.exists() else []}
    print(json.dumps(result, indent=1))
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
