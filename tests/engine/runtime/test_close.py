"""close() lets go at once: with the garbage collector off, no tensor of an engine's KV pool (nor
its swap space, decode-graph buffers or sampler workspace) outlives `close()`, and a dropped
engine frees them too, without close() and without a collection: nothing in the engine closes a
reference cycle. A second engine in the same process then builds and serves.

(On an H100 with the pool sized from memory, the pool used to stay alive until a collection
happened to run, 71 GB, and a second engine ran out of memory: bench/close_reuse.py measures
that on a GPU.) The model's weights are shared by every engine and stay loaded.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.runtime.protocols import StepItem


@contextmanager
def no_gc() -> Iterator[None]:
    gc.collect()  # what earlier tests left is not this test's business
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def exercise(eng: LLMEngine) -> None:
    """Every path that makes per-engine tensors: prefill, decode, CoW, greedy, sampled and
    beam requests, swaps where the config has CPU blocks."""
    seq = eng.add_sequence("The engine's house has")
    eng.append(seq, n=2)
    child = eng.fork(seq)
    eng.append(child, n=1)
    eng.free(child)
    eng.free(seq)
    eng.generate(["Once upon a time", "Hello"], SamplingParams(max_tokens=4, temperature=0.8, n=2))
    eng.generate(["Paged attention"], SamplingParams(max_tokens=3, beam_width=2))
    eng.generate(["Greedy, please"], SamplingParams(max_tokens=3))


def engine_tensors(eng: LLMEngine) -> list[weakref.ref]:
    """Weak references to the tensors this engine owns (not the shared weights)."""
    rt = eng.runtime
    tensors = [rt.cache.kv_cache, rt.cache.cpu_cache, rt.runner.graphs.buffer,
               *rt.runner.graphs._hosts, *rt.runner.sampler_workspace._buffers.values()]
    return [weakref.ref(t) for t in tensors]


def alive(refs: list[weakref.ref]) -> int:
    return sum(r() is not None for r in refs)


def config(model: str, **kw) -> EngineConfig:
    return EngineConfig(model=model, device="cpu", dtype="float32", block_size=4,
                        num_gpu_blocks=48, num_cpu_blocks=16, **kw)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_close_frees_the_pool_at_once_without_gc(tiny_model, async_scheduling):
    eng = LLMEngine(config("tiny-random", async_scheduling=async_scheduling))
    exercise(eng)
    refs = engine_tensors(eng)
    assert alive(refs) >= 4  # pool, swap space, decode buffer, workspace (at least)
    with no_gc():
        eng.close()
        assert alive(refs) == 0  # the engine object still exists: close() alone let go
        eng.close()  # idempotent
        with pytest.raises(RuntimeError, match="closed"):  # a clear error, not a None deep down
            eng.runtime.execute([StepItem([1], 0, [0])])
        del eng
        assert alive(refs) == 0


def test_a_dropped_engine_needs_no_gc(tiny_model):
    eng = LLMEngine(config("tiny-random", async_scheduling=True))
    exercise(eng)
    seq = eng.add_sequence("left running")  # state still held when it is dropped
    eng.append(seq, n=1)
    eng.add_request("an unfinished request", SamplingParams(max_tokens=8))
    eng.step()
    refs = engine_tensors(eng)
    engine = weakref.ref(eng)
    with no_gc():
        del eng
        assert engine() is None, "the engine is in a reference cycle"
        assert alive(refs) == 0


@pytest.mark.slow
@pytest.mark.model
def test_default_model_second_engine_after_close(default_model):
    first = LLMEngine(config("default"))
    exercise(first)
    want = first.generate(["The capital of France is"], SamplingParams(max_tokens=5))
    refs = engine_tensors(first)
    with no_gc():
        first.close()
        del first
        assert alive(refs) == 0
        second = LLMEngine(config("default"))
        got = second.generate(["The capital of France is"], SamplingParams(max_tokens=5))
        assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids
        assert second.runtime.loaded is default_model  # the weights are shared and stayed
        refs = engine_tensors(second)
        del second
        assert alive(refs) == 0
