"""The fused Triton sampling kernel (paged_kernels/sampling.py) against the plain-torch sampler.

Without CUDA the kernel runs through Triton's interpreter (`TRITON_INTERPRET=1`, set by the
folder's conftest.py before triton is imported), on small shapes: a vocabulary of a few
chunks. If another folder's tests imported triton first, uninterpreted, these tests run in a
fresh subprocess instead (as in test_kernel_ops.py).
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from engine.core.sampler_keys import SampleRequest, request_key, sample_uniform
from engine.core.sequence import SamplingParams
from engine.runtime.sampler import TorchScores, draw, round_uniforms
from tests.paged_kernels.triton_mode import (
    DEVICE,
    fallback_only,
    needs_triton,
    rerun_triton_tests_in_a_fresh_process,
)


@fallback_only
def test_triton_sampling_in_subprocess(request):
    """Fallback when triton was imported, uninterpreted, before this module."""
    rerun_triton_tests_in_a_fresh_process(__file__, request)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 64 tokens, so a vocabulary of 160 takes three (the last one partial)."""
    from paged_kernels import sampling

    monkeypatch.setattr(sampling, "BLOCK", 64)
    return sampling


def separated_rows(rows: int, vocab: int, live: int = 40, seed: int = 0) -> torch.Tensor:
    """Logits whose draws have no near-ties: `live` tokens a row, at random places, with
    scores at least 0.1 apart in [0, 6]; the rest far below (-25 give or take: weight ~1e-11,
    so where a chunk's scan adds them up does not move a boundary the draw could land near)."""
    g = torch.Generator().manual_seed(seed)
    out = -25.0 + 0.5 * torch.randn(rows, vocab, generator=g)
    for r in range(rows):
        where = torch.randperm(vocab, generator=g)[:live]
        levels = torch.randperm(61, generator=g)[:live].float() * 0.1
        out[r, where] = levels
    return out


def kernel_params(reqs: list[SampleRequest]) -> torch.Tensor:
    later = [round_uniforms(r.u) for r in reqs]
    return torch.tensor([[r.row for r in reqs], [r.params.temperature for r in reqs],
                         [r.params.top_p for r in reqs], [r.u for r in reqs],
                         [a for a, _ in later], [b for _, b in later]], dtype=torch.float32,
                        device=DEVICE)


PARAMS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9),
          SamplingParams(temperature=1.3, top_p=0.25), SamplingParams(temperature=0.9, top_k=5),
          SamplingParams(temperature=1.1, top_k=20, top_p=0.5), SamplingParams(temperature=2.0, top_p=0.1)]


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_sampling_draws_what_torch_draws(small_chunks, dtype):
    """Same uniforms, same tokens and settled flags as the torch `draw`; log probabilities as
    log_softmax's; a row's draw does not depend on the other rows of the batch."""
    logits = separated_rows(6, 160, seed=6).to(DEVICE, dtype)
    scores = logits.float()
    lp = torch.log_softmax(scores, -1)
    open_rows = 0
    # steps 0, 1 and 3 settle the top-p rows at rounds 0, 1 and 2 and leave some open; step 2
    # settles each row as one of them does (a draw costs the interpreter ~0.1 s)
    for step in (0, 1, 3):
        reqs = [SampleRequest(i, p, sample_uniform(request_key(i), 0, step))
                for i, p in enumerate(PARAMS)]
        _, want, want_ok = draw(scores, reqs)
        fused = TorchScores(logits, fused=True)
        kth = fused_kth(fused, reqs)
        tokens, token_lp, ok = small_chunks.sample(logits, kernel_params(reqs), kth)
        assert tokens.tolist() == want.tolist()
        assert ok.tolist() == want_ok.tolist()
        torch.testing.assert_close(token_lp, lp.gather(1, tokens[:, None])[:, 0], atol=1e-5, rtol=0)
        open_rows += int((~ok).sum())
        if step == 0:  # rows 4 and 1 alone, in that order: the same draws
            sub = [reqs[4], reqs[1]]
            alone, _, _ = small_chunks.sample(logits, kernel_params(sub), fused_kth(fused, sub))
            assert alone.tolist() == [want[4].item(), want[1].item()]
    assert open_rows > 0  # some rows went through all three rounds and still missed


def fused_kth(scores: TorchScores, reqs: list[SampleRequest]) -> torch.Tensor | None:
    from engine.runtime.sampler import _kth_scores

    vocab = scores.logits.shape[1]
    return _kth_scores(scores._raw, reqs) if any(0 < r.params.top_k < vocab for r in reqs) else None


@needs_triton
@pytest.mark.slow
def test_triton_sampling_counts_are_the_models_distribution():
    """Evenly spaced uniforms give exact counts (as test_sampler's torch tests) and uniforms just
    either side of each step of the CDF the tokens either side of it; greedy rows share the
    step; top-k keeps the k best."""
    probs = [0.5, 0.3, 0.15, 0.05]
    # n: the fewest uniforms whose counts are exact (top-k's renormalised 0.625 / 0.375 too), as
    # each row is a program of its own to interpret; the probes 1e-3 either side of each step
    # pin the CDF closer than a grid of 200 uniforms would
    for params, n, steps, expected in ((SamplingParams(temperature=1.0), 20, [0.5, 0.8, 0.95],
                                        {0: 10, 1: 6, 2: 3, 3: 1}),
                                       (SamplingParams(temperature=1.0, top_k=2), 8, [0.625],
                                        {0: 5, 1: 3})):
        probes = [c + d for c in steps for d in (-1e-3, 1e-3)]
        us = [(i + 0.5) / n for i in range(n)] + probes
        m = len(us)
        logits = torch.log(torch.tensor([probs] * (m + 1), device=DEVICE))
        logits[m] = torch.tensor([0.0, 3.0, 1.0, 2.0])  # a greedy row among them
        reqs = [SampleRequest(i, params, u) for i, u in enumerate(us)]
        out = TorchScores(logits, fused=True).sample_many(reqs + [SampleRequest(m, SamplingParams(), 0.0)])
        assert out[m][0] == 1 and out[m][1] == pytest.approx(float(torch.log_softmax(logits[m], -1)[1]))
        assert Counter(t for t, _ in out[:n]) == expected
        assert [t for t, _ in out[n:m]] == [t for s in range(len(steps)) for t in (s, s + 1)]
        assert all(math.isclose(lp, math.log(probs[t]), rel_tol=1e-5) for t, lp in out[:m])


@needs_triton
@pytest.mark.slow
def test_triton_top_p_frequencies_follow_the_nucleus(small_chunks):
    """Many uniforms on one row through `sample_many` (rows the kernel leaves open go to
    `exact_top_p`): every token inside the nucleus of the tempered distribution, computed by a
    sort, and each token's frequency within a few standard deviations of its nucleus probability.
    A kernel that cut no nucleus, or at the wrong place, or forgot the temperature fails."""
    small_chunks.BLOCK = 8  # 16 tokens: two chunks (the interpreter takes ~0.1 s a draw)
    vocab, n, temperature, top_p = 16, 100, 0.6, 0.7
    g = torch.Generator().manual_seed(272)
    # nucleus: 4 tokens (7 at temperature 1), the next one 8% of the mass with them. Few, heavy
    # tokens let 100 draws fail each fault above (the cut one token late included), and a
    # uniform nucleus, in more than 99.9% of draws of the uniforms (a binomial simulation)
    row = torch.randn(vocab, generator=g)
    probs = torch.softmax(row.double() / temperature, 0)
    values, order = torch.sort(probs, descending=True)
    keep = (torch.cumsum(values, 0) - values) < top_p * values.sum()
    nucleus = torch.zeros(vocab, dtype=torch.float64)
    nucleus[order[keep]] = values[keep] / values[keep].sum()
    assert 3 < int(keep.sum()) < vocab // 2  # a real cut, neither one token nor most of them
    sp = SamplingParams(temperature=temperature, top_p=top_p)
    reqs = [SampleRequest(0, sp, sample_uniform(request_key(11), 0, i)) for i in range(n)]
    out = TorchScores(row[None].to(DEVICE), fused=True).sample_many(reqs)
    counts = Counter(t for t, _ in out)
    assert set(counts) <= set(order[keep].tolist())
    for t, p in enumerate(nucleus.tolist()):
        bound = 4 * math.sqrt(p * (1 - p) / n) + 2 / n
        assert abs(counts[t] / n - p) <= bound, (t, counts[t] / n, p)
