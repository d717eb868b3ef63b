"""Tensor-parallel workers start as `python -m engine.tp.worker`: a plain script that builds a
TP engine at top level (no `if __name__ == "__main__":`) works and its workers never import it;
and when the engine's process dies (killed: no close(), no finalizer) its workers exit and
remove their private folder, with nothing left behind.

Under multiprocessing's spawn / forkserver each worker ran the user's main module again, so such
a script failed (or, worse, started engines inside its workers).

One script, one engine process and its two workers, for both (each costs seconds of imports on
two cores); close() ending the workers is checked in-process (tests/engine/tp/test_tp_paths.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.tp.processes import alive, wait_gone

pytestmark = [pytest.mark.model, pytest.mark.slow]  # worker processes
ROOT = Path(__file__).resolve().parents[3]

# No main guard, on purpose. The marker file counts how often this module is imported: a
# worker that imported it would add a line (and build engines of its own). It prints its
# engine's workers and waits to be killed.
PLAIN_SCRIPT = """
import json, os, sys
with open(sys.argv[2], "a") as f:
    f.write(f"{os.getpid()}\\n")
from engine import EngineConfig, LLMEngine, SamplingParams
eng = LLMEngine(EngineConfig(model=sys.argv[1], tensor_parallel_size=2, block_size=4,
                             num_gpu_blocks=16, device="cpu", dtype="float32"))
out = eng.generate(["Hello there"], SamplingParams(max_tokens=4, ignore_eos=True))
print(json.dumps({"pids": eng.engine_info()["worker pids"], "folder": eng.runtime.folder,
                  "tokens": list(out[0].outputs[0].token_ids)}), flush=True)
sys.stdin.read()  # until the test kills this process
"""


def test_a_plain_script_builds_a_tp_engine_at_top_level_and_its_workers_exit_when_it_dies(
        kv2_path, tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_SCRIPT)
    marker = tmp_path / "imports.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    errors = tmp_path / "stderr.txt"
    pids: list[int] = []
    with open(errors, "w") as err:
        proc = subprocess.Popen([sys.executable, str(script), kv2_path, str(marker)],
                                cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, text=True, env=env)
    try:
        line = proc.stdout.readline()  # the engine ran its request (or the script failed)
        assert line, f"the script exited with {proc.wait(60)}: {errors.read_text()[-3000:]}"
        result = json.loads(line)
        pids, folder = result["pids"], result["folder"]
        assert len(marker.read_text().split()) == 1  # the script ran once: no worker imported it
        assert len(result["tokens"]) == 4
        assert len(pids) == 2 and all(alive(p) for p in pids) and Path(folder).is_dir()
    finally:
        proc.kill()  # SIGKILL: the engine's process dies, nobody calls close()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()
    assert wait_gone(pids) == []  # the workers noticed (their lifeline pipe ended) and exited
    assert not Path(folder).exists()  # ... and removed the store's private folder
