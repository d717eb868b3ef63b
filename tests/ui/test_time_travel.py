"""Instant time travel: Back, Next and the timeline draw the view recorded at that point (no
engine work), and the page is exactly what a session replayed to that point would draw; acting
from a past point drops the future and moves the same engine back from a checkpoint (no replay
from the start), with the same result as a replay."""

from __future__ import annotations

import pytest

from engine import EngineConfig, SamplingParams, ops
from history.shelf import EVERY as CHECKPOINT_EVERY
from ui.render import render
from ui.session import Session


def drawn(session: Session) -> tuple:
    fig, events, texts, metrics, _, _, status = render(session)
    return fig.to_json(), events, texts, metrics, status.rpartition(" of ")[0]  # "operation k"


def script(n: int) -> list[ops.Op]:
    base = [ops.AddSequence("Four score and seven years ago"), ops.Append(0, 2), ops.Fork(0),
            ops.Append(1, 1), ops.AddRequest("Paged memory is", SamplingParams(max_tokens=3, n=2,
                                                                               temperature=0.8))]
    steps = [ops.Append(0, 1), ops.Append(1, 1), ops.Step()]
    return (base + steps * n)[:n]


@pytest.fixture(params=["dry", "tiny-random"])
def config(request) -> EngineConfig:
    if request.param == "dry":
        return EngineConfig(model=None, block_size=4, num_gpu_blocks=32)
    return EngineConfig(model="tiny-random", block_size=4, num_gpu_blocks=32, device="cpu",
                        dtype="float32")


def played(config: EngineConfig, n: int) -> Session:
    session = Session(config)
    for op in script(n):
        session.run(op)
    return session


def test_back_and_next_draw_recorded_views_equal_to_a_replay(config):
    session = played(config, 20)
    engine = session.engine
    for pos in (19, 12, 0, 7, 20):
        session.goto(pos)
        assert not session.engine_ready or pos == 20  # no engine work to draw a past point
        fresh = Session(config)
        for op in script(pos):
            fresh.run(op)
        assert drawn(session) == drawn(fresh)
    assert session.engine is engine  # the same engine throughout: nothing was rebuilt


def test_acting_from_the_past_drops_the_future_and_restores_from_a_checkpoint(config):
    session = played(config, 21)
    engine = session.engine
    at = CHECKPOINT_EVERY * 2 + 3
    session.goto(at)
    session.run(ops.Append(0, 2))
    assert len(session.ops) == at + 1 and session.pos == at + 1
    assert session.engine is engine  # moved back in place from a checkpoint, not replayed anew
    fresh = Session(config)
    for op in [*script(at), ops.Append(0, 2)]:
        fresh.run(op)
    assert drawn(session) == drawn(fresh)
    assert session.engine.trace == fresh.engine.trace
    session.engine.check_invariants()


def test_undo_then_act_equals_a_replay(config):
    session = played(config, 12)
    session.undo()
    session.undo()
    session.run(ops.Fork(0))
    fresh = Session(config)
    for op in [*script(10), ops.Fork(0)]:
        fresh.run(op)
    assert drawn(session) == drawn(fresh)


def test_a_pickled_session_draws_its_past_without_its_views(config):
    import pickle

    session = played(config, 9)
    copy = pickle.loads(pickle.dumps(session))
    copy.goto(4)
    fresh = played(config, 4)
    assert drawn(copy) == drawn(fresh)
