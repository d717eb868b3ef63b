"""Speculative decoding on real models: greedy and seeded sampled requests give exactly the
tokens of the engine without drafts (prompts that repeat themselves and prompts that do not,
block sizes 4 and 16, the prefix cache on and off, preemption by swap and by recompute); a later
request sharing a speculative request's text hits the blocks its kept drafts filled; and the
verification rule gives the target's distribution (chi-square on a small vocabulary)."""

from __future__ import annotations

import math

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.core.sampler_keys import SampleRequest, request_key, sample_uniform
from engine.core.speculation import accepted_prefix
from engine.runtime.sampler import TorchScores

REPEATS = ("The cat sat on the mat and looked at the dog. The cat sat on the mat and looked at "
           "the dog. The cat sat on the")
PLAIN = "Once upon a time"
SPEC = {"speculative_method": "ngram", "num_speculative_tokens": 4}


def _outputs(config: EngineConfig, prompts: list[str], params: SamplingParams):
    eng = LLMEngine(config)
    outs = eng.generate(prompts, params)
    eng.check_invariants()
    return [[c.token_ids for c in o.outputs] for o in outs], eng


def _both(model: str, prompts: list[str], params: SamplingParams, **cfg):
    base = dict(model=model, device="cpu", dtype="float32", track_kv_content=True, **cfg)
    plain, _ = _outputs(EngineConfig(**base), prompts, params)
    spec, eng = _outputs(EngineConfig(**base, **SPEC), prompts, params)
    return plain, spec, eng


@pytest.mark.model
@pytest.mark.parametrize(("block_size", "prefix"), [(4, True), (16, False)])
def test_greedy_with_drafts_equals_greedy_without(default_model, block_size, prefix) -> None:
    greedy = SamplingParams(max_tokens=20, ignore_eos=True)
    plain, spec, eng = _both("default", [REPEATS, PLAIN], greedy, block_size=block_size,
                             num_gpu_blocks=64, enable_prefix_caching=prefix)
    assert spec == plain
    m = eng.snapshot().metrics
    assert m.accepted_tokens > 0 and m.draft_tokens > m.accepted_tokens  # kept some, not all
    assert m.used_blocks == 0


@pytest.mark.model
@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_drafts_survive_preemption_in_a_small_pool(default_model, mode) -> None:
    greedy = SamplingParams(max_tokens=16, ignore_eos=True)
    prompts = [REPEATS, REPEATS.replace("cat", "bird"), PLAIN]
    cfg = dict(block_size=4, num_gpu_blocks=18, preemption_mode=mode,
               num_cpu_blocks=40 if mode == "swap" else 0)
    plain, spec, eng = _both("default", prompts, greedy, **cfg)
    assert spec == plain
    assert eng.scheduler.num_preemptions > 0 and eng.snapshot().metrics.accepted_tokens > 0


@pytest.mark.model
def test_seeded_samples_with_drafts_equal_those_without(default_model) -> None:
    """Each pick uses the request's random number for its output position, drafts or not."""
    sampled = SamplingParams(max_tokens=16, temperature=0.7, top_p=0.9, n=2, seed=5,
                             ignore_eos=True)
    plain, spec, eng = _both("default", [REPEATS], sampled, block_size=4, num_gpu_blocks=64)
    assert spec == plain and eng.snapshot().metrics.draft_tokens > 0


@pytest.mark.model
def test_a_later_request_hits_the_blocks_kept_drafts_filled(default_model) -> None:
    cfg = dict(model="default", device="cpu", dtype="float32", block_size=4, num_gpu_blocks=64)
    eng = LLMEngine(EngineConfig(**cfg, **SPEC))
    greedy = SamplingParams(max_tokens=16, ignore_eos=True)
    first = eng.generate(REPEATS, greedy)[0]
    assert first.accepted_tokens > 0
    # the first request's prompt and output, then more: its decode blocks are cached
    again = list(first.prompt_token_ids) + list(first.outputs[0].token_ids) + eng.encode(" #")
    hits_before = eng.snapshot().metrics.prefix_hit_blocks
    got = eng.generate(again, greedy)[0]
    hit = eng.snapshot().metrics.prefix_hit_blocks - hits_before
    assert hit * 4 > len(first.prompt_token_ids)  # past the prompt: blocks drafts filled
    plain = LLMEngine(EngineConfig(**cfg)).generate(again, greedy)[0]
    assert got.outputs[0].token_ids == plain.outputs[0].token_ids


@pytest.mark.parametrize("block_size", [4, 16])
def test_tiny_random_greedy_with_drafts_equals_without(tiny_model, block_size) -> None:
    greedy = SamplingParams(max_tokens=24, ignore_eos=True)
    plain, spec, _ = _both("tiny-random", [REPEATS, PLAIN], greedy, block_size=block_size,
                           num_gpu_blocks=48)
    assert spec == plain


# ---- the verification rule's distribution ------------------------------------------------------

CHI2_0_001 = {1: 10.83, 3: 16.27, 4: 18.47}  # chi-square at p = 0.001, by degrees of freedom


def _chi2(counts: list[int], probs: list[float]) -> float:
    n = sum(counts)
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs, strict=True))


def test_the_verification_rule_samples_the_targets_distribution() -> None:
    """A draft d verified by the step's own pick (kept if the pick is d, else the pick replaces
    it) is rejection sampling for a point-mass draft: d is kept with probability p(d), a
    rejected one is replaced by a sample of p without d, and the token that comes out is
    distributed as p. Checked with the engine's sampler on a five-token vocabulary."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]] * 2)
    params = SamplingParams(temperature=0.8)
    p = torch.softmax(logits[0] / 0.8, dim=-1).tolist()
    draft = 1
    kept, out, replaced = 0, [0] * 5, [0] * 5
    trials = 6000
    for trial in range(trials):
        key = request_key(trial)
        requests = [SampleRequest(row, params, sample_uniform(key, 0, row)) for row in (0, 1)]
        picks = [t for t, _ in TorchScores(logits.clone(), fused=False).sample_many(requests)]
        a = accepted_prefix([draft], picks[:1])
        kept += a
        out[picks[0]] += 1  # the token after the pending one: d if kept, else the replacement
        if not a:
            replaced[picks[0]] += 1
    assert replaced[draft] == 0
    assert _chi2([kept, trials - kept], [p[draft], 1 - p[draft]]) < CHI2_0_001[1]
    assert _chi2(out, p) < CHI2_0_001[4]
    rest = [q / (1 - p[draft]) for i, q in enumerate(p) if i != draft]
    assert _chi2([c for i, c in enumerate(replaced) if i != draft], rest) < CHI2_0_001[3]
    assert math.isclose(kept / trials, p[draft], abs_tol=0.03)
