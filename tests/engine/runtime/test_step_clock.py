"""What a step costs, measured (engine/runtime/step_clock.py): the interval from one forward pass
to the next, by kind and batch bucket; idle gaps and prefills are not a step's cost."""

from __future__ import annotations

from engine.runtime.step_clock import IDLE_S, MIN_SAMPLES, StepClock


def test_a_verification_step_costs_its_interval_to_the_next_pass_over_a_decode_step() -> None:
    clock, t = StepClock(), 0.0
    for _ in range(MIN_SAMPLES):
        clock.tick("decode", 64, t)
        t += 0.002  # a decode step: 2 ms to the next pass
        clock.tick("verify", 64, t)
        assert clock.ratio(64) is None  # until both kinds were seen MIN_SAMPLES times
        t += 0.005  # a verification: it lands before the next is scheduled
    clock.tick(None, 64, t)  # a prefill starts: the last verification's interval closes
    t += 0.050
    clock.tick("decode", 64, t)  # the prefill's interval is not kept
    assert abs(clock.ratio(64) - 2.5) < 1e-9
    assert clock.ratio(8) is None  # another bucket: nothing seen there
    assert clock.seen() == {"decode@64": 2.0, "verify@64": 5.0}


def test_an_idle_gap_between_runs_is_not_a_step() -> None:
    clock = StepClock()
    clock.tick("decode", 1, 0.0)
    clock.tick("decode", 1, 0.001)
    clock.tick("decode", 1, 0.001 + 2 * IDLE_S)  # the caller did something else meanwhile
    assert clock.seen() == {"decode@1": 1.0}

