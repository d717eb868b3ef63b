"""Every serving path under tensor parallelism on the CPU (gloo), against one process in
float32: async scheduling (the next step reads its tokens from the workers' own picks),
preemption by recompute, chunked prefill, prefix-cache hits, copy-on-write, sampled n = 2; the
workers' persistent rows compared with the engine's tables every step (content tracking on);
and a worker that dies while a step is in flight is a clear error.

One module-scoped TP = 2 engine (its workers take seconds to start on two cores); the test that
kills a worker runs last on it. Drafts, on both the decode buffers' path and the general one,
and close() share one more engine.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.tp.models import TINY_KV2, save_random_llama
from engine.tp.runtime import TensorParallelError

pytestmark = [pytest.mark.model, pytest.mark.slow]  # worker processes: seconds each
SYSTEM = "You are a helpful assistant who answers briefly. "


def _config(path: str, tp: int) -> EngineConfig:
    # 20 blocks of 4 slots for four requests: the scheduler preempts (recompute); a budget of 24
    # tokens a step chunks the long prompt; the shared system prompt is a prefix hit
    return EngineConfig(model=path, tensor_parallel_size=tp, block_size=4, num_gpu_blocks=20,
                        device="cpu", dtype="float32", preemption_mode="recompute",
                        max_num_batched_tokens=24, async_scheduling=True, track_kv_content=True)


@pytest.fixture(scope="module")
def tp2_async(kv2_path):
    eng = LLMEngine(_config(kv2_path, 2))
    yield eng
    eng.close()


def _serve(eng: LLMEngine) -> tuple[list[list[tuple[int, ...]]], set[str], list[dict]]:
    greedy = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)
    sampled = SamplingParams(max_tokens=8, temperature=0.9, top_k=20, n=2, seed=3, ignore_eos=True)
    requests = [(SYSTEM + "What is the capital of France?", greedy),
                (SYSTEM + "Name a colour.", greedy),
                ("A long story begins: " + "once there was a robot who walked and walked " * 3,
                 greedy),
                (SYSTEM + "Count to five.", sampled)]
    ids = [eng.add_request(p, params) for p, params in requests]
    done, kinds, wire = {}, set(), []
    while len(done) < len(ids):
        result = eng.step()
        kinds |= {e.kind for e in result.events}
        wire.append({k: v for k, v in eng.engine_info().items() if k.startswith("tp last step")})
        done.update({o.request_id: [c.token_ids for c in o.outputs] for o in result.finished})
        eng.check_invariants()  # the content shadow, and (TP) every worker's decode rows
    return [done[i] for i in ids], kinds, wire


def test_async_recompute_chunks_and_prefix_hits_match_one_process(tp2_async, kv2_path):
    want, want_kinds, _ = _serve(LLMEngine(_config(kv2_path, 1)))
    got, kinds, wire = _serve(tp2_async)
    assert got == want
    assert {"preempt", "prefix_hit", "cow", "share"} <= kinds == want_kinds
    assert tp2_async.scheduler.num_preemptions > 0
    chunks = [e for e in tp2_async.last_events if e.kind == "prefill"]
    assert not chunks  # the run ended in decodes
    device = [w for w in wire if w.get("tp last step: from the decode buffers")]
    assert len(device) > len(wire) // 2  # most steps ran from the workers' decode buffers
    totals = tp2_async.runtime.wire.totals
    assert totals["device_steps"] > 0 and totals["steps"] > totals["device_steps"]


def test_drafts_and_short_prompt_rests_from_the_decode_buffers_match_one_process(
        tmp_path, monkeypatch):
    """The path a GPU takes (PAGEDLAB_TP_STATIC_QUERIES=1 has the CPU workers take it): a
    verification of k + 1 queries a sequence, and the short rest of a prompt after a prefix
    hit, padded to one query length and run from the decode buffers; the workers pick each
    engine row's logits among the padded ones. And the general path: drafts verified in the
    step that prefills a longer prompt go eagerly, worker 0 returning a pick for each of a
    draft's k + 1 rows. Greedy tokens equal one process without drafts. Then close() ends the
    workers and removes their folder, with nothing left behind (twice: idempotent)."""
    monkeypatch.setenv("PAGEDLAB_TP_STATIC_QUERIES", "1")
    loop = "the cat sat on the mat and the dog sat on the log " * 3
    # the second: a hit, then a short rest; the last two come, one a step, while the others
    # draft (two chances of a step that verifies drafts beside a prefill)
    prompts = [loop, loop + "then", "Once upon a time",
               "A different prompt, one about the weather in the spring and the rain",
               "And one more, about a slow walk by the river late at night"]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    # SmolLM2's initialiser (0.02): a random model whose greedy output repeats, so it drafts
    model = str(save_random_llama(tmp_path / "loop", TINY_KV2, init=0.02))
    cfg = dict(model=model, block_size=4, num_gpu_blocks=64, device="cpu", dtype="float32",
               track_kv_content=True)
    want = [o.outputs[0].token_ids for o in LLMEngine(EngineConfig(**cfg)).generate(prompts, params)]
    eng = LLMEngine(EngineConfig(**cfg, tensor_parallel_size=2, speculative_method="ngram",
                                 num_speculative_tokens=4, prompt_lookup_min=1))
    try:
        ids = [eng.add_request(prompts[0], params)]
        eng.step()  # the first prompt's blocks are hashed: the second's prefix hits them
        ids += [eng.add_request(p, params) for p in prompts[1:3]]
        outs, verified, eager = {}, 0, 0
        while eng.has_pending_work():
            result = eng.step()
            eng.check_invariants()
            if len(ids) < len(prompts):  # the first three decode (and draft) from now on
                ids.append(eng.add_request(prompts[len(ids)], params))
            drafted = any(e.kind == "draft" for e in result.events)
            device = eng.engine_info()["tp last step: from the decode buffers"]
            verified += drafted and device
            eager += drafted and not device and result.num_prefills > 0
            outs.update({o.request_id: o for o in result.finished})
        assert [outs[i].outputs[0].token_ids for i in ids] == want
        assert verified > 0  # drafts were verified from the decode buffers
        assert eager > 0  # ... and beside a prompt's prefill, on the general path
        assert outs[ids[0]].accepted_tokens > 0
        assert eng.snapshot().metrics.prefix_hit_blocks > 0
        pids, folder = eng.engine_info()["worker pids"], eng.runtime.folder
        eng.close()
        eng.close()  # idempotent
        assert eng.runtime.closed and not Path(folder).exists()
        assert not any(_running(p) for p in pids)  # exited and reaped: no zombie either
    finally:
        eng.close()


def test_a_worker_killed_while_a_step_is_in_flight_is_a_clear_error(tp2_async):
    pids = tp2_async.engine_info()["worker pids"]
    tp2_async.add_request("Hello there", SamplingParams(max_tokens=50, ignore_eos=True))
    for _ in range(3):
        tp2_async.step()
    os.kill(pids[0], signal.SIGKILL)  # the rank that answers every step
    with pytest.raises(TensorParallelError, match=rf"rank 0 \(pid {pids[0]}\) exited with code -9"):
        for _ in range(5):
            tp2_async.step()
    with pytest.raises(TensorParallelError, match="workers are stopped"):
        tp2_async.step()


def _running(pid: int) -> bool:
    """Whether `pid` is still a process (a zombie included: close() must reap its workers)."""
    return Path(f"/proc/{pid}").exists()
