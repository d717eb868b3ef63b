"""bench/tensor_parallel.py's fallbacks for issue 43's two-GPU run, without a GPU: a TP engine
that fails to start is tried with NCCL in its graphs, then with eager workers."""

from __future__ import annotations

from bench.tensor_parallel import _attempts


def test_a_failing_tp_engine_is_tried_with_nccl_then_eager():
    auto, nccl, eager = (True, "auto"), (True, "nccl"), (False, "nccl")
    assert _attempts(2, True, "auto", 0) == [(0, auto), (1, nccl), (2, eager)]
    assert _attempts(2, True, "nccl", 0) == [(0, nccl), (2, eager)]  # nothing tried twice
    # after a failure the part goes on from there, an engine asked for NCCL included
    assert _attempts(2, True, "auto", 1) == [(1, nccl), (2, eager)]
    assert _attempts(2, True, "nccl", 1) == [(1, nccl), (2, eager)]
    assert _attempts(2, True, "auto", 2) == [(2, eager)]
    assert _attempts(1, True, "auto", 2) == [(0, auto)]  # one process: nothing to fall back on
