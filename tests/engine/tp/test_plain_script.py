"""Tensor-parallel workers start as `python -m engine.tp.worker`: a plain script that builds a
TP engine at top level (no `if __name__ == "__main__":`) works, its workers never import it, and
close() ends them with nothing left behind.

Under multiprocessing's spawn / forkserver each worker ran the user's main module again, so such
a script failed (or, worse, started engines inside its workers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.tp.models import TINY_KV2, save_random_llama

pytestmark = [pytest.mark.model, pytest.mark.slow]  # worker processes
ROOT = Path(__file__).resolve().parents[3]

# No main guard, on purpose. The marker file counts how often this module is imported: a
# worker that imported it would add a line (and build engines of its own).
PLAIN_SCRIPT = """
import json, os, sys
with open(sys.argv[2], "a") as f:
    f.write(f"{os.getpid()}\\n")
from engine import EngineConfig, LLMEngine, SamplingParams
eng = LLMEngine(EngineConfig(model=sys.argv[1], tensor_parallel_size=2, block_size=4,
                             num_gpu_blocks=16, device="cpu", dtype="float32"))
pids = eng.engine_info()["worker pids"]
out = eng.generate(["Hello there"], SamplingParams(max_tokens=4, ignore_eos=True))
folder = eng.runtime.folder
eng.close()
eng.close()  # idempotent
print(json.dumps({"pids": pids, "tokens": list(out[0].outputs[0].token_ids),
                  "folder": folder, "closed": eng.runtime.closed}))
"""


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.split()[2] == "Z"


def test_a_plain_script_builds_a_tp_engine_at_top_level(tmp_path):
    model = save_random_llama(tmp_path / "llama-kv2", TINY_KV2)
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_SCRIPT)
    marker = tmp_path / "imports.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script), str(model), str(marker)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(marker.read_text().split()) == 1  # the script ran once: no worker imported it
    assert len(result["tokens"]) == 4 and result["closed"]
    assert len(result["pids"]) == 2 and all(_gone(p) for p in result["pids"])
    assert not Path(result["folder"]).exists()
