"""The written contracts (engine/runtime/protocols.py): every scores class implements the whole
`Scores` protocol, pick_rows included; both runtimes implement `ModelRuntime` with one execute
signature; the contracts import no torch, so the torch-free engine can name them."""

from __future__ import annotations

import inspect
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from engine.config import EngineConfig
from engine.core.sampler_keys import SampleRequest
from engine.core.sequence import SamplingParams
from engine.dry.dry_model import DryScores
from engine.dry.dry_runtime import DryRuntime
from engine.runtime.protocols import HostPicks, ModelRuntime, Picks, Scores, StepItem
from engine.runtime.runtime import Runtime
from engine.runtime.sampler import TorchScores
from engine.tp.remote_scores import RemoteScores, StepReply
from engine.tp.runtime import TPRuntime

ROOT = Path(__file__).resolve().parents[3]


def _scores() -> list[object]:
    logits = torch.randn(3, 50)
    greedy = [(float(t), 0.0) for t in logits.argmax(-1).tolist()]
    reply = StepReply(lambda: np.asarray(greedy, dtype=np.float64).tobytes())  # worker 0's bytes
    return [TorchScores(logits), DryScores(3, random.Random(0)),
            RemoteScores(reply, 3, lambda step, rows: logits, 1)]


def test_every_scores_class_implements_the_whole_protocol():
    reqs = [SampleRequest(r, SamplingParams(), 0.5) for r in range(3)]
    for scores in _scores():
        assert isinstance(scores, Scores), type(scores).__name__
        picks = scores.pick_rows(reqs)
        assert isinstance(picks, Picks)
        assert picks.result() == scores.sample_many(reqs)
        assert isinstance(scores.can_overlap, bool)
        assert (scores.greedy(0) is None) == (not scores.has_argmax)
        assert len(scores.top_many([0, 2], [2, 3])[1]) == 3
    assert [s.can_overlap for s in _scores()] == [True, True, False]  # TP: only when async
    assert isinstance(HostPicks([(1, 0.0)]), Picks)


def test_the_three_runtimes_share_one_contract_and_one_execute_signature():
    members = [n for n in dir(ModelRuntime) if not n.startswith("_")]
    assert {"execute", "primitive_token", "save_blocks", "can_save_blocks"} <= set(members)
    for cls in (Runtime, TPRuntime, DryRuntime):
        for name in members:
            assert hasattr(cls, name), (cls.__name__, name)
    params = [list(inspect.signature(cls.execute).parameters)
              for cls in (Runtime, TPRuntime, DryRuntime)]
    assert params[0] == params[1] == params[2] == ["self", "items", "feed"]


def test_the_dry_runtime_is_a_runtime():
    """The dry mode meets the engine through the same contract: scores for every item's rows,
    a primitive's token drawn from its seeded RNG, copies that move nothing, and a saved state
    (its RNG's) that a runtime of the same config loads."""
    config = EngineConfig(model=None, block_size=4, num_gpu_blocks=8)
    dry, other = DryRuntime(config), DryRuntime(config)
    assert isinstance(dry, ModelRuntime)
    items = [StepItem([1, 2], 0, [0]), StepItem([3], 5, [1, 2], num_logits=3)]
    assert dry.execute(items).num_rows == 4
    saved = dry.save_blocks([0, 1], [])
    drawn = [dry.primitive_token(None) for _ in range(5)]
    other.load_blocks(saved)
    assert [other.primitive_token(None) for _ in range(5)] == drawn
    assert dry.max_model_len == 32 and dry.num_layers == 0 and dry.loaded is None


def test_the_contracts_import_no_torch():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['numpy'] = None\n"
            "import engine.runtime.protocols, engine.dry.dry_model, engine.dry.dry_runtime\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
