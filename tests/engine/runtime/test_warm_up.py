"""When an engine compiles and captures at start (PAGEDLAB_WARMUP): every engine, once per
loaded model per process (the app), or never; never on ZeroGPU."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine
from engine.runtime.model_runner import ModelRunner


@pytest.fixture
def warm_ups(monkeypatch, tiny_model) -> list[int]:
    """Counts the runner's warm-ups (on a CPU the real one has nothing to capture and says 0 s)."""
    calls: list[int] = []

    def fake_warm_up(self, log=None) -> float:
        calls.append(1)
        return 0.5

    monkeypatch.setattr(ModelRunner, "warm_up", fake_warm_up)
    monkeypatch.setattr(tiny_model, "warmed_up", False)  # restored after the test
    return calls


def engines(n: int) -> list[float]:
    return [LLMEngine(EngineConfig(model="tiny-random", device="cpu", dtype="float32"))
            .runtime.warm_up_seconds for _ in range(n)]


@pytest.mark.parametrize(("policy", "expected"), [("1", [0.5, 0.5, 0.5]), ("once", [0.5, 0.0, 0.0]),
                                                  ("0", [0.0, 0.0, 0.0])])
def test_warm_up_policy(monkeypatch, warm_ups, policy, expected):
    monkeypatch.setenv("PAGEDLAB_WARMUP", policy)
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    assert engines(3) == expected
    assert len(warm_ups) == sum(1 for s in expected if s)


def test_no_warm_up_on_zerogpu(monkeypatch, warm_ups):
    monkeypatch.setenv("PAGEDLAB_WARMUP", "1")
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert engines(1) == [0.0] and not warm_ups


def test_settling_the_heap_freezes_it_and_makes_young_collections_rarer() -> None:
    """What a warm GPU engine does: what lives at the settling leaves the collector's
    generations, and a step's transient objects (fewer than the threshold) come and go without
    a young collection (at CPython's 700 these 5,000 would have paused seven times each)."""
    import gc

    from engine.runtime.collector import YOUNG_THRESHOLD, settle_heap

    kept = [[i] for i in range(1000)]  # alive at the settling
    before, thresholds = gc.get_freeze_count(), gc.get_threshold()
    collections = []

    def heard(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    try:
        settle_heap()
        assert gc.get_freeze_count() >= before + len(kept)
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *thresholds[1:])
        gc.callbacks.append(heard)
        for _ in range(50):  # a step's worth of short-lived tracked objects, 50 times
            transient = [[i] for i in range(YOUNG_THRESHOLD // 4)]
            del transient
        assert collections == []
    finally:
        if heard in gc.callbacks:
            gc.callbacks.remove(heard)
        gc.set_threshold(*thresholds)
        gc.unfreeze()
