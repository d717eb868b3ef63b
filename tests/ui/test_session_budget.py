"""The sessions' memory budget (ui/session_budget.py): a session is counted at twice its KV pool
from the moment it builds an engine; a new engine that does not fit lets idle sessions go first
and is otherwise refused with what to do; a session idle for the idle limit lets go anyway, keeps
its log and views, tells its visitor, and rebuilds on its next action; checkpoints never hold
more than the pool itself."""

from __future__ import annotations

import pytest

from engine import EngineConfig, ops
from ui import session as session_module
from ui.session import Session, UserError
from ui.session_budget import DRY_BYTES, MIB, SessionBudget, reserve

TINY = EngineConfig(model="tiny-random", block_size=4, num_gpu_blocks=64, num_cpu_blocks=64,
                    device="cpu")


@pytest.fixture
def budget(monkeypatch, tiny_model):
    """A budget of its own for the test (the process's is shared by every other test)."""
    def make(mib: float, idle_s: float = 900, pressure_s: float = 120, most: int = 64):
        b = SessionBudget(int(mib * MIB), most, idle_s, pressure_s)
        monkeypatch.setattr(session_module, "BUDGET", b)
        monkeypatch.setattr(session_module, "MAX_SESSIONS", most)
        return b
    return make


def test_a_session_is_counted_at_twice_its_pool_swap_and_tier():
    assert reserve(EngineConfig(model=None, block_size=4, num_gpu_blocks=4096), None) == DRY_BYTES
    cfg = EngineConfig(model="default", block_size=16, num_gpu_blocks=64, num_cpu_blocks=64,
                       num_offload_blocks=8)
    assert reserve(cfg, 737_280) == 2 * (64 + 64 + 8) * 737_280


def test_a_new_engine_that_does_not_fit_is_refused_with_what_to_do(budget):
    b = budget(1.5)  # tiny-random: 1 KiB a token, 4 tokens a block, 128 blocks: 1 MiB counted
    first = Session(TINY)
    first.run(ops.AddSequence("hello"))
    assert first in b and b.held_bytes() == 2 * 128 * 4 * 1024
    second = Session(TINY)
    with pytest.raises(UserError) as err:
        second.run(ops.AddSequence("hello"))
    message = str(err.value)
    for what in ("MiB", "smaller pool", "dry mode", "try again", "bash scripts/run.sh"):
        assert what in message
    assert second.ops == [] and second not in b  # refused: nothing changed
    first.close()
    second.run(ops.AddSequence("hello"))  # the closed session's room is free again
    assert second in b


def test_under_pressure_the_least_recently_active_idle_session_lets_go(budget):
    b = budget(2.5, idle_s=900, pressure_s=60)  # room for two tiny sessions
    a, c = Session(TINY), Session(TINY)
    a.run(ops.AddSequence("first"))
    a.run(ops.Append(0, n=2))
    drawn = [a.frame().snapshot]
    a.goto(1)
    drawn.insert(0, a.frame().snapshot)
    c.run(ops.AddSequence("second"))
    a.active_at -= 100  # idle past the pressure limit, not the idle one
    third = Session(TINY)
    third.run(ops.AddSequence("third"))
    assert a not in b and not a.engine_ready and c in b and third in b
    assert "idle for 2 minutes" in a.take_notice()
    for pos in (1, 2):  # Back and Next still draw what was recorded, with no engine
        a.goto(pos)
        assert a.frame().snapshot == drawn[pos - 1] and a not in b
    c.active_at -= 100  # now c is the one to go when a comes back
    a.run(ops.Append(0, n=1))  # rebuilt from its log, then the new op
    assert a in b and c not in b and len(a.ops) == 3
    a.goto(2)
    assert a.frame().snapshot == drawn[1]


def test_a_session_idle_past_the_limit_lets_go_without_pressure_but_not_while_acting(budget):
    b = budget(100, idle_s=30)
    idle, busy, other = Session(TINY), Session(TINY), Session(TINY)
    for s in (idle, busy):
        s.run(ops.AddSequence("x"))
        s.active_at -= 60
    with busy.lock:  # mid-operation: never let go under its feet
        other.run(ops.AddSequence("y"))
        assert idle not in b and busy in b
    assert "idle for 1 minutes" in idle.take_notice()
    other.run(ops.Append(0, n=1))  # any acting click sweeps: the idle one goes now
    assert busy not in b and other in b


@pytest.mark.slow  # 48 real-tensor appends
def test_checkpoints_hold_at_most_the_pool_itself(budget):
    budget(100)
    s = Session(EngineConfig(model="tiny-random", block_size=4, num_gpu_blocks=16, device="cpu"))
    s.run(ops.AddSequence("a short prompt"))
    for _ in range(48):
        s.run(ops.Append(0, n=1))
    pool = 16 * 4 * 1024  # tiny-random: 1 KiB a token
    run = s.run_history
    assert 0 < run.checkpoint_bytes() <= pool and len(run.checkpoint_positions()) >= 2
    s.goto(30)
    s.run(ops.Append(0, n=1))  # acting from the past still comes back from a checkpoint
    assert len(s.ops) == 31
