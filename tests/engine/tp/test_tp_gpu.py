"""Tensor parallelism on two GPUs (skipped without them): each rank's decode and verification
steps are CUDA graphs with the all-reduces captured inside (each fused with the norm after it,
on symmetric memory; NCCL in eager steps), and the tokens equal one GPU's in float32, with
graphs on or off, synchronous or async, through beams, sampling, swaps, prefix hits and drafts.

Run by bench/tp_gpu.py on the two-GPU machine (its part "pytest"); NVLink multicast stays off
in every process (engine/tp/launch.py forces it off for the workers).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.tp.models import TINY_KV2, save_random_llama

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
PROMPTS = ["The capital of France is", "Once upon a time, a small robot",
           "Tensor parallelism splits every layer", "1, 2, 3, 4,", "Hello", "A B C D E F G"]


@contextmanager
def _env(**values: str) -> Iterator[None]:
    """Environment for the workers an engine starts inside (they inherit it)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _cfg(path: str, tp: int, **extra) -> EngineConfig:
    # async scheduling, and a pool of 28 blocks of 4 that _serve's requests must swap to share
    cfg = dict(model=path, tensor_parallel_size=tp, device="cuda", dtype="float32",
               block_size=4, num_gpu_blocks=28, num_cpu_blocks=64, preemption_mode="swap",
               max_num_seqs=16, async_scheduling=True)
    return EngineConfig(**(cfg | extra))


def _greedy(eng: LLMEngine, n: int = 24) -> list[tuple[int, ...]]:
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return [o.outputs[0].token_ids for o in eng.generate(PROMPTS, params)]


def _serve(eng: LLMEngine) -> list[list[tuple[int, ...]]]:
    """Beams, sampled n = 2, greedy, a shared prefix (hits), more than the pool holds (swaps)."""
    system = "You are a helpful assistant who answers briefly and well. " * 2
    requests = [(PROMPTS[0], SamplingParams(max_tokens=20, beam_width=2, ignore_eos=True)),
                (system + "Name a colour.", SamplingParams(max_tokens=40, ignore_eos=True)),
                (system + "Count to five.", SamplingParams(max_tokens=40, ignore_eos=True)),
                (PROMPTS[1], SamplingParams(max_tokens=16, n=2, temperature=0.8, top_k=50,
                                            seed=7, ignore_eos=True))]
    ids = [eng.add_request(p, params) for p, params in requests]
    done = {}
    while len(done) < len(ids):
        done.update({o.request_id: [c.token_ids for c in o.outputs] for o in eng.step().finished})
    eng.check_invariants()
    return [done[i] for i in ids]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(save_random_llama(tmp_path_factory.mktemp("tpgpu") / "llama-kv2", TINY_KV2))


@pytest.fixture(scope="module")
def one_gpu(model) -> dict[str, list]:
    eng = LLMEngine(_cfg(model, 1))
    try:
        return {"greedy": _greedy(eng), "serve": _serve(eng)}
    finally:
        eng.close()


def test_tp2_graphs_float32_equal_one_gpu_through_every_path(model, one_gpu):
    """Greedy batches, then beams, sampling, swaps and prefix hits, async scheduling on: each
    rank's decode steps replay CUDA graphs with the all-reduces inside."""
    eng = LLMEngine(_cfg(model, 2))
    try:
        info = eng.engine_info()
        assert "CUDA graphs" in info["decode steps"], info["decode steps"]
        assert _greedy(eng) == one_gpu["greedy"]
        assert eng.runtime.wire.totals["device_steps"] > 0
        assert _serve(eng) == one_gpu["serve"]
        assert eng.scheduler.num_preemptions > 0 and eng.snapshot().metrics.prefix_hit_blocks > 0
        # the graphs' sums ran on symmetric memory (PAGEDLAB_TP_ALLREDUCE=auto), each fused
        # with the norm after it (engine/tp/fused_norm.py: the lean decoder's every sum)
        assert info["all-reduce"].startswith("symmetric memory"), info["all-reduce"]
        assert "sum + norm in one kernel: on" in info["all-reduce"], info["all-reduce"]
        captured = eng.runtime.model_info["allreduce"]["captured"]
        assert captured.get("fused_norm", 0) > 0, captured
    finally:
        eng.close()


def test_tp2_graphs_off_equal_graphs_on(model, one_gpu):
    with _env(PAGEDLAB_TP_GRAPHS="0"):
        eng = LLMEngine(_cfg(model, 2))
    try:
        assert "eagerly" in eng.engine_info()["decode steps"]
        assert "no CUDA graphs" in eng.engine_info()["all-reduce"]  # eager steps: NCCL
        assert _greedy(eng) == one_gpu["greedy"]
    finally:
        eng.close()


def test_tp2_drafts_verified_in_graphs_equal_one_gpu_without_drafts(tmp_path):
    loop = str(save_random_llama(tmp_path / "loop", TINY_KV2, init=0.02))  # greedy output repeats
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    sync = dict(async_scheduling=False, num_gpu_blocks=256)
    one = LLMEngine(_cfg(loop, 1, **sync))
    try:
        want = [o.outputs[0].token_ids for o in one.generate(PROMPTS, params)]
    finally:
        one.close()
    eng = LLMEngine(_cfg(loop, 2, speculative_method="ngram", num_speculative_tokens=4,
                         prompt_lookup_min=1, **sync))
    try:
        outs = eng.generate(PROMPTS, params)
        assert [o.outputs[0].token_ids for o in outs] == want
        assert sum(o.accepted_tokens for o in outs) > 0
    finally:
        eng.close()
