"""The batched sampler: the distributions it draws from, and seeds that reproduce a request's
tokens whatever else is in the batch.

Draws are inverse CDFs at a uniform number, so evenly spaced uniforms give exact frequencies:
without top-p the distribution tests below count, they do not estimate.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.core.sampler_keys import SampleRequest, request_key, sample_uniform
from engine.runtime.sampler import (
    SamplerWorkspace,
    TorchScores,
    _row_argmax,
    _top_values,
    draw,
    exact_top_p,
    greedy_pair,
)

N = 1000
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def frequencies(probs: list[float], device: str = "cpu", **params) -> Counter:
    """Token counts over N evenly spaced uniforms, one row each, all in one batch."""
    logits = torch.log(torch.tensor([probs] * N, device=device))
    sp = SamplingParams(temperature=params.pop("temperature", 1.0), **params)
    reqs = [SampleRequest(i, sp, (i + 0.5) / N) for i in range(N)]
    out = TorchScores(logits).sample_many(reqs)
    assert all(math.isclose(lp, math.log(probs[t]), rel_tol=1e-4) for t, lp in out)
    return Counter(t for t, _ in out)


@pytest.mark.parametrize("device", DEVICES)
def test_temperature_one_draws_the_models_distribution(device):
    assert frequencies([0.5, 0.3, 0.15, 0.05], device) == {0: 500, 1: 300, 2: 150, 3: 50}


def near(counts: Counter, expected: dict[int, int]) -> bool:
    """Same support, each count within 5% of N of the expected one (top-p draws by rejection:
    a rejected row draws again at another uniform, so its counts are not exact)."""
    return set(counts) == set(expected) and all(abs(counts[t] - c) <= N // 20
                                                for t, c in expected.items())


@pytest.mark.parametrize("device", DEVICES)
def test_top_k_and_top_p_cut_and_renormalise(device):
    p = [0.5, 0.3, 0.15, 0.05]
    assert frequencies(p, device, top_k=2) == {0: 625, 1: 375}
    # the mass before token 1 is 0.5 < 0.8: it stays; before token 2 it is 0.8: cut
    assert near(frequencies(p, device, top_p=0.8), {0: 625, 1: 375})
    assert near(frequencies(p, device, top_p=0.81), {0: 526, 1: 316, 2: 158})
    assert frequencies(p, device, top_p=0.01) == {0: N}
    # top-p over what top-k left: of {0.5, 0.3} renormalised, 0.625 alone reaches 0.6
    assert frequencies(p, device, top_k=2, top_p=0.6) == {0: N}


def test_low_temperature_sharpens():
    counts = frequencies([0.5, 0.3, 0.15, 0.05], temperature=0.25)
    assert counts[0] > 800 and counts[3] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_a_flat_rows_nucleus_is_drawn_by_rejection_without_a_sort(device):
    """A flat row (as a random-weight model gives): every draw lies in the nucleus, spread over
    it by its probabilities; rows the device rounds leave open are few and settled exactly."""
    vocab = 512
    probs = torch.linspace(2.0, 1.0, vocab, device=device)
    probs = probs / probs.sum()
    nucleus = int((torch.cumsum(probs, 0) - probs < 0.9).sum())
    sp = SamplingParams(temperature=1.0, top_p=0.9)
    reqs = [SampleRequest(i, sp, sample_uniform(request_key(7), 0, i)) for i in range(400)]
    logits = torch.log(probs).repeat(400, 1)
    _, _, settled = draw(logits, reqs)
    assert int(settled.sum()) >= 395  # each round stands with probability >= 0.9
    tokens = [t for t, _ in TorchScores(logits).sample_many(reqs)]
    assert max(tokens) < nucleus < vocab  # never outside the nucleus
    assert len(set(tokens)) > 200  # and spread over it
    # the best half of the nucleus is more likely than the worse half, as its mass says
    assert sum(t < nucleus // 2 for t in tokens) > sum(t >= nucleus // 2 for t in tokens)
    exact = exact_top_p(probs.repeat(50, 1), reqs[:50]).tolist()
    assert max(exact) < nucleus


def test_greedy_and_sampled_rows_share_a_step():
    logits = torch.log(torch.tensor([[0.1, 0.9], [0.6, 0.4], [0.2, 0.8]]))
    greedy, sampled = SamplingParams(), SamplingParams(temperature=1.0)
    out = TorchScores(logits).sample_many([SampleRequest(0, greedy, 0.0),
                                           SampleRequest(1, sampled, 0.7),
                                           SampleRequest(2, greedy, 0.0)])
    assert [t for t, _ in out] == [1, 1, 1]


def test_uniforms_are_counters_not_state():
    key = request_key(1234)
    us = [sample_uniform(key, i, pos) for i in range(8) for pos in range(64)]
    assert len(set(us)) == len(us) and all(0 <= u < 1 for u in us)
    assert 0.45 < sum(us) / len(us) < 0.55
    assert sample_uniform(key, 3, 5) == sample_uniform(request_key(1234), 3, 5)


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_a_seeded_request_draws_the_same_tokens_whatever_else_is_in_the_batch(tiny_model, top_p):
    params = SamplingParams(max_tokens=8, n=2, temperature=0.9, top_p=top_p, seed=99,
                            ignore_eos=True)
    prompt = list(range(5, 17))

    def tokens(others: int, first: bool) -> list[list[int]]:
        eng = LLMEngine(EngineConfig(model=tiny_model.name, device="cpu", dtype="float32",
                                     num_gpu_blocks=128, block_size=4))
        noise = [list(range(30 + i, 40 + 2 * i)) for i in range(others)]
        extra = SamplingParams(max_tokens=5, n=3, temperature=1.3, ignore_eos=True)
        if not first:
            for p in noise:
                eng.add_request(p, extra)
        rid = eng.add_request(prompt, params)
        if first:
            for p in noise:
                eng.add_request(p, extra)
        done = {}
        while eng.scheduler.has_work():
            done.update({o.request_id: o for o in eng.step().finished})
        eng.check_invariants()
        return [list(c.token_ids) for c in done[rid].outputs]

    alone = tokens(0, True)
    assert alone[0] != alone[1]  # the two samples differ
    assert tokens(3, False) == alone == tokens(2, True)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_changes_no_sampled_output(tiny_model, mode):
    """Seeds are counters, not RNG state: a preempted request draws what it would have drawn."""
    prompts = [[100 + i, 200 + i, 300 + i, 400 + i, 500 + i] for i in range(3)]
    params = SamplingParams(max_tokens=6, n=2, temperature=1.0, top_p=0.9, ignore_eos=True)

    def run(blocks: int) -> tuple[list[list[list[int]]], int]:
        eng = LLMEngine(EngineConfig(model=tiny_model.name, device="cpu", dtype="float32",
                                     block_size=4, num_gpu_blocks=blocks, preemption_mode=mode,
                                     num_cpu_blocks=64 if mode == "swap" else 0))
        outs = eng.generate(prompts, params)
        eng.check_invariants()
        return [[list(c.token_ids) for c in o.outputs] for o in outs], eng.scheduler.num_preemptions

    expected, none = run(64)
    got, preemptions = run(9)
    assert none == 0 and preemptions > 0
    assert got == expected


def test_a_shared_workspace_changes_no_draw():
    """Two steps' scores share the runner's workspace, used in turns: each draws what it draws
    alone, and a stale one does not read what the other left in the buffers."""
    g = torch.Generator().manual_seed(5)
    a, b = (torch.randn(6, 2048, generator=g) for _ in range(2))
    sp = [SamplingParams(), SamplingParams(temperature=0.8, top_p=0.9),
          SamplingParams(temperature=1.2, top_k=7, top_p=0.5)]
    reqs = [SampleRequest(i, sp[i % 3], sample_uniform(request_key(i), 0, 3)) for i in range(6)]
    want_a, want_b = TorchScores(a).sample_many(reqs), TorchScores(b).sample_many(reqs)
    ws = SamplerWorkspace()
    first, second = TorchScores(a, workspace=ws), TorchScores(b, workspace=ws)
    assert first.sample_many(reqs) == want_a
    assert second.sample_many(reqs) == want_b
    assert first.sample_many(reqs[1:]) == want_a[1:]  # after `second` wrote over the buffers
    assert [first.greedy(i) for i in range(6)] == [TorchScores(a).greedy(i) for i in range(6)]


def test_greedy_without_log_softmax():
    """The greedy choice from block maxima (a CPU's argmax over the vocabulary is slow) is
    torch.argmax's, ties to the first column included; its log probability log_softmax's."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 1000, generator=g)
    x[0, [3, 700]] = 9.0  # a tie across blocks: the first wins
    x[1, [260, 261]] = 9.0  # inside one block
    x[2, 999] = 9.0  # in the short last block
    assert _row_argmax(x).tolist() == x.argmax(-1).tolist() == [3, 260, 999, *x[3:].argmax(-1).tolist()]
    best, lp = greedy_pair(x)
    assert best.tolist() == x.argmax(-1).tolist()
    torch.testing.assert_close(lp, torch.log_softmax(x, -1).amax(-1), atol=1e-6, rtol=0)


def test_top_k_values_from_the_best_blocks_are_topk():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(7, 4096, generator=g)
    x[0, :300] = 5.0  # ties spanning two blocks
    ints = torch.randint(0, 4, (9, 2048), generator=g).float()  # ties everywhere
    for t, k in ((x, 1), (x, 5), (x, 12), (ints, 20)):
        assert torch.equal(_top_values(t, k), torch.topk(t, k).values)


def test_later_rounds_uniforms_at_once_equal_the_scalar_ones():
    import numpy as np

    from engine.core.sampler_keys import request_key, sample_uniform
    from engine.runtime.sampler import round_uniforms, round_uniforms_many

    us = [sample_uniform(request_key(s), i, p) for s in range(5) for i in range(4) for p in range(50)]
    us += [0.0, 1 - 2.0 ** -53]
    a, b = round_uniforms_many(np.array(us))
    assert [(x, y) for x, y in zip(a.tolist(), b.tolist(), strict=True)] == [round_uniforms(u) for u in us]


def test_uniforms_hashed_at_once_equal_the_scalar_ones():
    from engine.core.sampler_keys import request_key, sample_uniform, sample_uniforms

    counters = [(request_key(s), i, p) for s in (0, 7, 2**62) for i in range(3) for p in range(40)]
    assert sample_uniforms(counters).tolist() == [sample_uniform(*c) for c in counters]
