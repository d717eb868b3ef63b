"""Contiguous-reservation baselines: the arithmetic checked by hand on small workloads."""

import pytest

from engine import EngineConfig, LLMEngine
from engine.describe.baselines import naive_blocks_for, reservation_fit, reserved_slots, workload


def reqs(*lens: tuple[int, int], max_len: int = 64) -> list[dict]:
    return [{"prompt": [1] * p, "output": o, "max_len": max_len} for p, o in lens]


def test_reserved_slots_per_policy():
    assert reserved_slots(10, 64, "max") == 64
    assert reserved_slots(10, 64, "pow2") == 16
    assert reserved_slots(16, 64, "pow2") == 16
    assert reserved_slots(17, 64, "pow2") == 32
    assert reserved_slots(10, 64, "oracle") == 10


def test_reservation_fit_admits_in_order_until_the_pool_is_full():
    work = reqs((4, 6), (10, 10), (3, 2))  # final lengths 10, 20, 5
    assert reservation_fit(work, 100, "max") == {
        "policy": "max", "admitted": 1, "reserved": 64, "used": 10, "utilization": 10 / 64,
        "internal_fragmentation": 54, "external_fragmentation": 36}  # 64 - 10 and 100 - 64
    pow2 = reservation_fit(work, 100, "pow2")  # 16 + 32 + 8
    assert (pow2["admitted"], pow2["reserved"], pow2["used"]) == (3, 56, 35)
    oracle = reservation_fit(work, 30, "oracle")  # 10 + 20 fit, 5 more does not
    assert (oracle["admitted"], oracle["reserved"]) == (2, 30)
    with pytest.raises(ValueError, match="policy must be"):
        reservation_fit(work, 100, "lifo")


def test_workload_is_seeded_and_bounded():
    a, b = workload(50, 3, 128), workload(50, 3, 128)
    assert a == b
    assert all(1 <= len(r["prompt"]) and len(r["prompt"]) + r["output"] <= 128 for r in a)
    with pytest.raises(ValueError):
        workload(0, 3, 128)


def test_naive_blocks_for_a_live_snapshot():
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=16))
    a = eng.add_sequence("abcdef")  # 6 tokens
    eng.fork(a)
    snap = eng.snapshot()
    assert naive_blocks_for(snap, 32, "max") == 2 * 8  # two sequences, 32 slots each
    assert naive_blocks_for(snap, 32, "oracle") == 2 * 2  # no sharing: 2 blocks each
    assert snap.metrics.used_blocks == 2  # paging shares them


def test_paged_fit_matches_what_a_dry_engine_admits():
    from engine.describe.baselines import paged_fit
    from lessons.helpers import admit

    work = workload(120, 1, 512)
    fit = paged_fit(work, 8192, 16)
    eng = LLMEngine(EngineConfig(model=None, block_size=16, num_gpu_blocks=8192 // 16,
                                 enable_prefix_caching=False))
    assert fit["admitted"] == admit(eng.apply, work)
    assert fit["reserved"] == eng.snapshot().metrics.used_blocks * 16
    assert fit["external_fragmentation"] == 0 and fit["internal_fragmentation"] < 16 * fit["admitted"]
