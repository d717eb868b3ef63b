"""Speculative decoding through the decode graphs on a GPU: a verification step replays a graph
of k + 1 queries a sequence and decides greedy acceptance on the device; the tokens must be those
of the engine without drafts (float32), with async scheduling and without, and the device's
decisions equal the host's comparison (checked on every verified draft while content is tracked).

A random model in SmolLM2-135M's shapes with its initialiser (0.02, tied embeddings) soon repeats
a token forever, so its drafts are kept: the case where verification steps replace decode steps."""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.tp.models import save_random_llama

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SMOL = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
            num_key_value_heads=3, head_dim=64)


@pytest.fixture(scope="module")
def smol(tmp_path_factory) -> str:
    return str(save_random_llama(tmp_path_factory.mktemp("smol") / "llama", SMOL, init=0.02))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_drafts_through_the_graphs_change_no_greedy_token(smol, async_scheduling) -> None:
    prompts = [[300 + (j % 9) for j in range(40)] + [1000 + i] for i in range(6)]
    params = SamplingParams(max_tokens=96, ignore_eos=True)

    def run(k: int) -> tuple[list, LLMEngine]:
        spec = {"speculative_method": "ngram", "num_speculative_tokens": k} if k else {}
        eng = LLMEngine(EngineConfig(model=smol, device="cuda", dtype="float32", block_size=16,
                                     num_gpu_blocks=256, async_scheduling=async_scheduling,
                                     track_kv_content=True, **spec))
        outs = eng.generate(prompts, params)
        eng.check_invariants()
        return [list(o.outputs[0].token_ids) for o in outs], eng

    plain, _ = run(0)
    drafted, eng = run(4)
    assert drafted == plain
    metrics = eng.snapshot().metrics
    assert metrics.accepted_tokens > 100  # the loops were drafted and kept
    graphs = eng.runtime.runner.graphs
    # verification steps replayed as graphs: k + 1 = 5 queries, in the graphs of max_query
    assert graphs.max_query >= 5 and any(q == graphs.max_query for _, q in graphs.graphs)
    assert graphs.ratios  # and their cost measured against decode steps at start
    assert eng.runtime.step_costs()  # the steps' own costs measured, for the drafts' choice


def test_sampled_drafts_that_are_rejected_keep_the_tokens_and_soon_stop(smol) -> None:
    """Temperature 1 on this nearly flat model: the lookup finds the prompt's loop, sampling
    rejects its drafts. Seeded samples are those of the engine without drafts (rejection
    sampling's rule), and the sequences soon stop drafting (issue 44: drafts that fail must
    cost nothing)."""
    prompts = [[300 + (j % 9) for j in range(40)] + [1000 + i] for i in range(16)]
    params = SamplingParams(max_tokens=64, temperature=1.0, seed=7, ignore_eos=True)

    def run(k: int) -> tuple[list, int, int]:
        spec = {"speculative_method": "ngram", "num_speculative_tokens": k,
                "prompt_lookup_min": 1} if k else {}
        eng = LLMEngine(EngineConfig(model=smol, device="cuda", dtype="float32", block_size=16,
                                     num_gpu_blocks=256, async_scheduling=True, **spec))
        steps = drafting = 0
        for p in prompts:
            eng.add_request(p, params)
        outs = []
        while eng.has_pending_work():
            res = eng.step()
            outs += res.finished
            steps += 1
            drafting += any(e.kind == "draft" for e in res.events)
        outs.sort(key=lambda o: o.request_id)
        return [list(o.outputs[0].token_ids) for o in outs], drafting, steps

    plain, _, _ = run(0)
    drafted, drafting, steps = run(4)
    assert drafted == plain
    assert drafting <= max(4, steps // 8), (drafting, steps)
