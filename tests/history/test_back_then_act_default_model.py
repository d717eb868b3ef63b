"""Back, Next and acting from the past on the default model (SmolLM2-135M, float32), as a visitor
clicks: random click sequences through a Session (its run history moves the one engine back
from checkpoints and forward by replay). Each sequence must end in the state a replay of the op
log from the start gives: the same bookkeeping and the same K/V bytes in every block that holds
data, in every layer. The dry fuzz (tests/ui/test_session_fuzz.py) checks every click; this one
checks what only a real model has: bytes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import EngineConfig, LLMEngine
from engine.ops import OpError
from tests.helpers import fingerprint
from tests.ui.test_session_fuzz import click
from ui.session import Session, UserError

# the clicks of the dry fuzz, without export/import (a real replay each: slow, and tested there)
KINDS = ["new", "append", "fork", "free", "add_request", "step", "back", "next", "undo", "goto"]
clicks = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 9), st.integers(1, 3)),
                  min_size=4, max_size=12)
CONFIG = EngineConfig(model="default", block_size=4, num_gpu_blocks=24, num_cpu_blocks=8,
                      preemption_mode="swap", device="cpu", dtype="float32")


def held_bytes(eng: LLMEngine) -> dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]:
    """The K and V of every GPU block that holds data, in every layer, by (block, layer): its
    filled slots only. A slot past them is never read and may hold what the block's earlier owner
    wrote, in a timeline that Back left (a block freed by the move back and handed out again)."""
    snap = eng.snapshot()
    layers = eng.engine_info().get("layers") or eng.loaded_model().num_layers
    out = {}
    for b in snap.blocks:
        if b.state == "free" or not b.num_filled:
            continue
        for layer in range(layers):
            k, v = eng.inspect_block(b.block_id, layer)
            out[b.block_id, layer] = (k[: b.num_filled], v[: b.num_filled])
    return out


@pytest.mark.slow  # five runs of up to 13 real-model clicks, and their replays
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=clicks)
def test_random_back_next_and_acts_end_as_a_replay_does_bytes_included(default_model, script) -> None:
    s = Session(CONFIG)
    try:
        for kind, a, b in [("new", 0, 1), *script]:
            try:
                click(s, kind, a, b)
            except (UserError, OpError):  # refused: all or nothing (the dry fuzz checks it)
                pass
        here = s.engine  # moved to the cursor from wherever the clicks left it
        here.check_invariants()
        again = LLMEngine.replay(CONFIG, s.ops[: s.pos])
        assert fingerprint(here) == fingerprint(again)
        mine, theirs = held_bytes(here), held_bytes(again)
        assert mine.keys() == theirs.keys()
        for key, (k, v) in mine.items():
            assert torch.equal(k, theirs[key][0]) and torch.equal(v, theirs[key][1]), key
        again.close()
    finally:
        s.close()
