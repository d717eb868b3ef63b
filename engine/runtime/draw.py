"""The plain-torch draw: one token per row at the row's uniform number, after temperature,
top-k and top-p, for a whole step at once (`paged_kernels.sampling` is the same in one Triton launch).

Owns the arithmetic of a draw: the tempered, top-k-cut weights; the inverse CDF in two levels
(block sums, then one block); top-p by rejection rounds, with `exact_top_p` as the last resort;
and the uniforms of the later rounds (`round_uniforms`), hashed from the row's first uniform so
that a draw needs no RNG state.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.core.sampler_keys import SampleRequest, _mix64, mix64_array
from engine.runtime.row_reductions import row_max as rows_max
from engine.runtime.row_reductions import top_values
from engine.runtime.sampler_workspace import SamplerWorkspace, scratch
from engine.runtime.transfer import to_device


def params_to_device(first: list[list[float]], requests: list[SampleRequest], need_p: bool,
                      dev: torch.device) -> torch.Tensor:
    """float32 [len(first) + 5, rows] on the device in one transfer: the rows of `first`, then
    each request's temperature, top-p, uniform and its two later rounds' uniforms (zeros
    without top-p). Built as one array: a Python list per row per step costs the host more."""
    n = len(requests)
    m = np.zeros((len(first) + 5, n), dtype=np.float32)
    for i, row in enumerate(first):
        m[i] = row
    k = len(first)
    m[k] = [r.params.temperature for r in requests]
    m[k + 1] = [r.params.top_p for r in requests]
    us = np.fromiter((r.u for r in requests), dtype=np.float64, count=n)
    m[k + 2] = us
    if need_p:
        m[k + 3], m[k + 4] = round_uniforms_many(us)
    return to_device(m, torch.float32, dev)


def round_uniforms_many(us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`round_uniforms` of every uniform at once (numpy's uint64 arithmetic wraps at 2**64, as
    `_mix64`'s masks do, so the values are the same)."""
    x = mix64_array((us * float(1 << 53)).astype(np.uint64))
    scale = 1.0 / (1 << 24)
    return (x >> np.uint64(40)).astype(np.float64) * scale, \
        ((x >> np.uint64(16)) & np.uint64(0xFFFFFF)).astype(np.float64) * scale


def round_uniforms(u: float) -> tuple[float, float]:
    """Rounds 1 and 2's uniforms (24 bits each, as float32 holds them) for a row whose first
    uniform is u: one more scramble of u's bits."""
    x = _mix64(int(u * (1 << 53)))
    return (x >> 40) * (1.0 / (1 << 24)), ((x >> 16) & 0xFFFFFF) * (1.0 / (1 << 24))


def draw(scores: torch.Tensor, requests: list[SampleRequest], row_max: torch.Tensor | None = None,
         workspace: SamplerWorkspace | None = None
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token per row of float32 `scores` [rows, vocab] (logits or log probabilities: a
    row's constant does not matter), row i under requests[i]; `row_max` [rows], each row's
    largest score, when the caller has it; `workspace` for the full-size temporaries (the
    weights returned then live in it, until its next use). Returns the rows' weights after
    temperature and top-k (unnormalised probabilities, the best token's 1) [rows, vocab], the
    token ids [rows] and whether each row is settled (bool [rows]); all on the device, no sync.

    Temperature scales; top-k keeps the k best (ties with the k-th stay); top-p keeps, of what
    is left, the shortest best-first run whose mass reaches p of the whole (a token stays while
    the mass before it is below that, so the best always stays); the inverse CDF at the row's
    uniform picks the token, in vocabulary order: nothing is sorted, nothing normalised, and
    no full-size temporary is new when a workspace is given.

    Top-p by rejection, so the nucleus is never sorted out of the vocabulary: draw from the
    tokens above a pivot (first: all of them); a draw inside the nucleus (the mass of the
    tokens more likely than it is below p) stands, else its weight becomes the pivot and the
    row draws again. What stands is drawn from the nucleus with the right probabilities
    (rejection from a superset of it), and each round stands with probability at least p. On a
    GPU the rounds run for every row (a settled row keeps its token), so nothing waits for the
    device; a row still open after three rounds (u, then round_uniforms' two) is drawn again
    by `exact_top_p`. `paged_kernels.sampling` does the same in one kernel."""
    rows, vocab = scores.shape
    dev = scores.device
    ks = [r.params.top_k if 0 < r.params.top_k < vocab else vocab for r in requests]
    need_p = any(r.params.top_p < 1.0 for r in requests)
    k_t, temps, top_p, u0, u1, u2 = params_to_device([ks], requests, need_p, dev).unbind(0)
    top = rows_max(scores) if row_max is None else row_max
    weights = tempered_weights(scores, top, temps, k_t, ks, workspace)
    tokens, total = inverse_cdf(weights, u0)
    if not need_p:
        return weights, tokens, torch.ones(rows, dtype=torch.bool, device=dev)
    limit = top_p * total  # the total from the scan's block sums: no pass of its own
    spare = scratch(workspace, "scratch", weights)
    w_t = weights.gather(1, tokens[:, None])
    settled = (top_p >= 1.0) | (_mass_above(weights, w_t, spare) < limit)
    if dev.type != "cpu":  # rounds for every row: reading which are open would sync
        return (weights, *_rounds(weights, tokens, w_t, limit, settled, (u1, u2), spare))
    # on a CPU there is nothing to keep busy: the later rounds run for the open rows alone
    open_rows = (~settled).nonzero()[:, 0]
    if len(open_rows):
        sub = weights.index_select(0, open_rows)
        got, ok = _rounds(sub, tokens[open_rows], w_t[open_rows], limit[open_rows],
                          settled[open_rows], (u1[open_rows], u2[open_rows]), torch.empty_like(sub))
        tokens = tokens.index_copy(0, open_rows, got)
        settled = settled.index_copy(0, open_rows, ok)
    return weights, tokens, settled


def tempered_weights(scores: torch.Tensor, top: torch.Tensor, temps: torch.Tensor,
                     k_t: torch.Tensor, ks: list[int], workspace: SamplerWorkspace | None) -> torch.Tensor:
    """exp((score - row max) / T), zero below the row's k-th largest (ks[i] = vocab: no cut)."""
    vocab = scores.shape[1]
    weights = torch.sub(scores, top[:, None], out=scratch(workspace, "weights", scores))
    weights.div_(temps[:, None]).exp_()
    if any(k < vocab for k in ks):
        kth = top_values(weights, max(k for k in ks if k < vocab))
        kth = kth.gather(1, (k_t.long() - 1).clamp(max=kth.shape[1] - 1)[:, None])
        kth = torch.where(k_t[:, None] < vocab, kth, 0.0)  # a row that cuts nothing keeps all
        # weights below the cut times 0.0: a float comparison, no bool tensor (see `_above`)
        weights.mul_(torch.ge(weights, kth, out=scratch(workspace, "scratch", weights)))
    return weights



def kth_scores(logits: torch.Tensor, requests: list[SampleRequest]) -> torch.Tensor:
    """Each request's k-th largest score of its row (-inf where it cuts nothing): the fused
    kernel's top-k threshold (tokens whose weight is below the k-th's weigh 0)."""
    vocab = logits.shape[1]
    ks = [r.params.top_k if 0 < r.params.top_k < vocab else vocab for r in requests]
    rows, k_t = to_device([[r.row for r in requests], ks], torch.long, logits.device).unbind(0)
    values = torch.topk(logits.index_select(0, rows), max(k for k in ks if k < vocab), dim=-1).values
    kth = values.gather(1, (k_t - 1).clamp(max=values.shape[1] - 1)[:, None])[:, 0].float()
    return torch.where(k_t < vocab, kth, float("-inf")).contiguous()


def _above(weights: torch.Tensor, level: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """The weights above each row's level, the rest 0, in `scratch`. A comparison written as
    floats times the weights: on a CPU two passes without a bool mask cost a quarter of what
    torch.where over a mask does."""
    return torch.gt(weights, level, out=scratch).mul_(weights)


def _mass_above(weights: torch.Tensor, level: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """Each row's weight of the tokens above its level."""
    return _above(weights, level, scratch).sum(-1)


def _rounds(weights: torch.Tensor, tokens: torch.Tensor, pivot: torch.Tensor, limit: torch.Tensor,
            settled: torch.Tensor, uniforms: tuple[torch.Tensor, ...], scratch: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection rounds after the first: an open row draws from the tokens more likely than
    its last draw (the pivot) and stands when the draw is inside the nucleus."""
    for u in uniforms:
        drawn = inverse_cdf(_above(weights, pivot, scratch), u)[0]
        tokens = torch.where(settled, tokens, drawn)
        w_t = weights.gather(1, tokens[:, None])
        inside = _mass_above(weights, w_t, scratch) < limit
        pivot = torch.where(settled[:, None], pivot, w_t)
        settled = settled | inside
    return tokens, settled


def exact_top_p(weights: torch.Tensor, requests: list[SampleRequest]) -> torch.Tensor:
    """The last resort for a row that `draw`'s rounds left open: the nucleus by a sort of the
    row, drawn at one more uniform of the row's."""
    dev = weights.device
    top_p, u = to_device([[r.params.top_p for r in requests],
                           [round_uniforms(round_uniforms(r.u)[1])[0] for r in requests]],
                          torch.float32, dev).unbind(0)
    values, order = torch.sort(weights, dim=-1, descending=True)
    cum = torch.cumsum(values, dim=-1)
    values = values.masked_fill(cum - values >= top_p[:, None] * cum[:, -1:], 0.0)
    return order.gather(1, inverse_cdf(values, u)[0][:, None])[:, 0]


INVERSE_CDF_BLOCK = 256  # the inverse CDF scans blocks of this many tokens, then one block


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Column of each row's first entry whose cumulative mass passes u x the row's total (never
    an entry of zero mass), and the rows' totals. In two levels, so no scan runs over the whole
    vocabulary (a cumsum over [256, 49152] took 157 us on an H100, a sum 25): block sums, the
    block the target falls in, then a scan of that block alone."""
    rows, vocab = probs.shape
    b = INVERSE_CDF_BLOCK
    pad = -vocab % b
    if pad:
        probs = torch.nn.functional.pad(probs, (0, pad))
    blocks = probs.view(rows, -1, b)
    block_cdf = blocks.sum(-1).cumsum(-1)  # [rows, vocab / b]
    total = block_cdf[:, -1]
    target = (u * total)[:, None]
    which = torch.searchsorted(block_cdf, target, right=True).clamp(max=block_cdf.shape[1] - 1)
    before = torch.where(which > 0, block_cdf.gather(1, (which - 1).clamp(min=0)), 0.0)
    inner = blocks.gather(1, which[:, :, None].expand(rows, 1, b))[:, 0].cumsum(-1)  # [rows, b]
    # rounding may put the target at or past the block's own total: stay inside its mass
    rest = torch.minimum((target - before).clamp(min=0.0), inner[:, -1:] * (1 - 2.0 ** -20))
    pick = torch.searchsorted(inner, rest.contiguous(), right=True).clamp(max=b - 1)
    return (which * b + pick)[:, 0], total


