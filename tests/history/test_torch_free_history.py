"""A run's history is torch-free: with torch and numpy blocked, `history` imports and plays a dry
run through every move (act, Back, act from the past, Undo, a fresh engine mid-run), as the
README's layering promises (history/ sits on the engine's face, not on its tensors)."""

from __future__ import annotations

import subprocess
import sys

from tests.engine.core.test_torch_free import BLOCK_TORCH, ROOT

BLOCKED_RUN = BLOCK_TORCH + """
from engine import EngineConfig, ops
from history import RunHistory

run = RunHistory(EngineConfig(model=None, block_size=4, num_gpu_blocks=32))
seq = run.act(ops.AddSequence("Four score and seven years ago"))
for _ in range(12):
    run.act(ops.Append(seq, n=1))
run.goto(3)
run.act(ops.Fork(seq))
run.undo()
run.reconfigure(EngineConfig(model=None, block_size=8, num_gpu_blocks=16))
run.act(ops.AddSequence("again"))
run.engine_at(2).check_invariants()
print(len(run), sorted(m for m in sys.modules if m.partition(".")[0] in ("torch", "numpy")))
"""


def test_a_history_plays_with_torch_and_numpy_blocked() -> None:
    proc = subprocess.run([sys.executable, "-c", BLOCKED_RUN], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.split(maxsplit=1) == ["5", "[]\n"]
