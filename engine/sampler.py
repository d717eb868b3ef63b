"""Next-token choice from real logits for a whole batch at once: greedy, temperature, top-k,
top-p, per-request seeds; beam candidates.

Wraps one step's logits (one row per sequence that ran). Every sampled row of the step is drawn
in a few tensor operations on the device and read back in one transfer, so a step does not sync
once per sequence (`torch.multinomial` row by row did, twice).

Seeds without generators: a sampled token is the inverse CDF of the row's (temperature-scaled,
top-k / top-p filtered) distribution at one uniform number `u`. `u` is a counter-based hash of
(request seed, sample index within the request, output position), computed on the host
(`sample_uniform`), so a seeded request draws the same tokens whatever else is in the batch,
whatever row it lands in, and after a preemption; no RNG state lives between steps.
"""

from __future__ import annotations

import torch

from engine.sampler_keys import SampleRequest, _mix64
from engine.step_picks import StepPicks


class TorchScores:
    def __init__(self, logits: torch.Tensor, logprobs: torch.Tensor | None = None,
                 greedy: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """`logprobs` and `greedy` (token ids, their log probs): already computed on the device
        by the decode graph, when it ran."""
        self.logits = logits.float()  # [rows, vocab]
        self.num_rows = logits.shape[0]
        self._logprobs = logprobs
        self._greedy_tensors = greedy
        self._greedy: list[tuple[int, float]] | None = None

    def logprobs(self) -> torch.Tensor:
        if self._logprobs is None:
            self._logprobs = torch.log_softmax(self.logits, dim=-1)
        return self._logprobs

    def _greedy_pair(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._greedy_tensors is None:
            lp = self.logprobs()
            best = lp.argmax(dim=-1)
            self._greedy_tensors = best, lp.gather(1, best[:, None])[:, 0]
        return self._greedy_tensors

    def greedy(self, row: int) -> tuple[int, float]:
        if self._greedy is None:
            best, best_lp = self._greedy_pair()
            self._greedy = list(zip(best.tolist(), best_lp.tolist(), strict=True))
        return self._greedy[row]

    def sample_many(self, requests: list[SampleRequest]) -> list[tuple[int, float]]:
        """(token, its log probability under the model) for each request, in order. Greedy
        requests (temperature 0) and sampled ones share one transfer back; a second comes only
        for the rare row that `draw` could not settle (see there)."""
        if not requests:
            return []
        sampled = [r for r in requests if r.params.temperature > 0]
        if not sampled:
            return [self.greedy(r.row) for r in requests]
        best, best_lp = self._greedy_pair()
        dev = self.logits.device
        n, m = self.num_rows, len(sampled)
        if m == n and all(r.row == i for i, r in enumerate(sampled)):
            logprobs, row_max = self.logprobs(), best_lp
        else:
            rows = _to_device([r.row for r in sampled], torch.long, dev)
            logprobs, row_max = self.logprobs().index_select(0, rows), best_lp.index_select(0, rows)
        # from the log probabilities, whose row maximum the greedy choice already holds
        weights, tokens, settled = draw(logprobs, sampled, row_max)
        # one transfer for every row: greedy pairs, then the sampled ones (token ids are exact
        # in float64), then whether each draw stands
        values = torch.cat([best.double(), best_lp.double(), tokens.double(),
                            logprobs.gather(1, tokens[:, None])[:, 0].double(),
                            settled.double()]).tolist()
        greedy = list(zip(map(int, values[:n]), values[n:2 * n], strict=True))
        drawn = list(zip(map(int, values[2 * n:2 * n + m]), values[2 * n + m:2 * n + 2 * m],
                         strict=True))
        open_rows = [i for i, ok in enumerate(values[2 * n + 2 * m:]) if not ok]
        if open_rows:  # rare: a row whose rejection rounds all missed the nucleus
            idx = _to_device(open_rows, torch.long, dev)
            again = exact_top_p(weights.index_select(0, idx), [sampled[i] for i in open_rows])
            values = torch.cat([again.double(), logprobs.index_select(0, idx).gather(
                1, again[:, None])[:, 0].double()]).tolist()
            for j, i in enumerate(open_rows):
                drawn[i] = (int(values[j]), values[len(open_rows) + j])
        it = iter(drawn)
        return [next(it) if r.params.temperature > 0 else greedy[r.row] for r in requests]

    def pick_rows(self, requests: list[SampleRequest]) -> StepPicks:
        """`sample_many` for async scheduling, with nothing read back yet: one pick per row
        (greedy, or the row's draw), left on the device. Only for requests whose draws always
        settle at once (no top-p: its rare unsettled rows need the host)."""
        best, best_lp = self._greedy_pair()
        tokens, logprobs = best.clone(), best_lp.clone()
        sampled = [r for r in requests if r.params.temperature > 0]
        if sampled:
            rows = _to_device([r.row for r in sampled], torch.long, self.logits.device)
            lp = self.logprobs().index_select(0, rows)
            _, drawn, _ = draw(lp, sampled, best_lp.index_select(0, rows))
            tokens.index_copy_(0, rows, drawn)
            logprobs.index_copy_(0, rows, lp.gather(1, drawn[:, None])[:, 0])
        return StepPicks(tokens, logprobs, [r.row for r in requests])

    def top_many(self, rows: list[int], ks: list[int]) -> list[list[tuple[int, float]]]:
        """The ks[i] most likely next tokens of rows[i] with their log probabilities, best
        first: one top-k over all the rows (beam candidates of the whole step), one transfer."""
        if not rows:
            return []
        idx = _to_device(rows, torch.long, self.logits.device)
        values, ids = torch.topk(self.logprobs().index_select(0, idx), max(ks), dim=-1)
        both = torch.stack([ids.double(), values.double()]).tolist()
        return [list(zip(map(int, i[:k]), v[:k], strict=True))
                for i, v, k in zip(both[0], both[1], ks, strict=True)]

    def top(self, row: int, k: int) -> list[tuple[int, float]]:
        """The k most likely next tokens with their log probabilities, best first."""
        return self.top_many([row], [k])[0]


def _to_device(values: list, dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
    """A small host list on the device without a sync: from pinned memory on a GPU (a copy from
    pageable memory may wait for the stream, i.e. for the whole forward pass)."""
    t = torch.tensor(values, dtype=dtype)
    if dev.type == "cuda":
        t = t.pin_memory()
    return t.to(dev, non_blocking=True)


def round_uniforms(u: float) -> tuple[float, float]:
    """Rounds 1 and 2's uniforms (24 bits each, as float32 holds them) for a row whose first
    uniform is u: one more scramble of u's bits."""
    x = _mix64(int(u * (1 << 53)))
    return (x >> 40) * (1.0 / (1 << 24)), ((x >> 16) & 0xFFFFFF) * (1.0 / (1 << 24))


def draw(scores: torch.Tensor, requests: list[SampleRequest], row_max: torch.Tensor | None = None
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token per row of float32 `scores` [rows, vocab] (logits or log probabilities: a
    row's constant does not matter), row i under requests[i]; `row_max` [rows], each row's
    largest score, when the caller has it. Returns the rows' weights after temperature and
    top-k (unnormalised probabilities, the best token's 1) [rows, vocab], the token ids [rows]
    and whether each row is settled (bool [rows]); all on the device, no sync.

    Temperature scales; top-k keeps the k best (ties with the k-th stay); top-p keeps, of what
    is left, the shortest best-first run whose mass reaches p of the whole (a token stays while
    the mass before it is below that, so the best always stays); the inverse CDF at the row's
    uniform picks the token, in vocabulary order: nothing is sorted, nothing normalised, and
    full-size temporaries are few (on a CPU each new [256, 49152] tensor costs more in page
    faults than the arithmetic on it).

    Top-p by rejection, so the nucleus is never sorted out of the vocabulary: draw from the
    tokens above a pivot (first: all of them); a draw inside the nucleus (the mass of the
    tokens more likely than it is below p) stands, else its weight becomes the pivot and the
    row draws again. What stands is drawn from the nucleus with the right probabilities
    (rejection from a superset of it), and each round stands with probability at least p. On a
    GPU the rounds run for every row (a settled row keeps its token), so nothing waits for the
    device; a row still open after three rounds (u, then round_uniforms' two) is drawn again
    by `exact_top_p`."""
    rows, vocab = scores.shape
    dev = scores.device
    ks = [r.params.top_k if 0 < r.params.top_k < vocab else vocab for r in requests]
    need_p = any(r.params.top_p < 1.0 for r in requests)
    later = [round_uniforms(r.u) for r in requests] if need_p else [(0.0, 0.0)] * rows
    host = _to_device([[r.params.temperature for r in requests], [r.params.top_p for r in requests],
                       ks, [r.u for r in requests], [a for a, _ in later], [b for _, b in later]],
                      torch.float32, dev)
    temps, top_p, k_t, u0, u1, u2 = host.unbind(0)
    top = scores.amax(-1) if row_max is None else row_max
    weights = scores.sub(top[:, None]).div_(temps[:, None]).exp_()  # one new tensor
    if any(k < vocab for k in ks):
        kth = torch.topk(weights, max(k for k in ks if k < vocab), dim=-1).values
        kth = kth.gather(1, (k_t.long() - 1).clamp(max=kth.shape[1] - 1)[:, None])
        weights.masked_fill_((weights < kth) & (k_t[:, None] < vocab), 0.0)
    tokens = _inverse_cdf(weights, u0)
    if not need_p:
        return weights, tokens, torch.ones(rows, dtype=torch.bool, device=dev)
    limit = top_p * weights.sum(-1)
    scratch, mask = torch.empty_like(weights), torch.empty(weights.shape, dtype=torch.bool, device=dev)
    w_t = weights.gather(1, tokens[:, None])
    settled = (top_p >= 1.0) | (_mass_above(weights, w_t, scratch, mask) < limit)
    if dev.type != "cpu":  # rounds for every row: reading which are open would sync
        return (weights, *_rounds(weights, tokens, w_t, limit, settled, (u1, u2), scratch, mask))
    # on a CPU there is nothing to keep busy: the later rounds run for the open rows alone
    open_rows = (~settled).nonzero()[:, 0]
    if len(open_rows):
        sub = weights.index_select(0, open_rows)
        got, ok = _rounds(sub, tokens[open_rows], w_t[open_rows], limit[open_rows],
                          settled[open_rows], (u1[open_rows], u2[open_rows]),
                          torch.empty_like(sub), torch.empty(sub.shape, dtype=torch.bool))
        tokens = tokens.index_copy(0, open_rows, got)
        settled = settled.index_copy(0, open_rows, ok)
    return weights, tokens, settled


def _mass_above(weights: torch.Tensor, level: torch.Tensor, scratch: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
    """Each row's weight of the tokens above its level, in the given buffers."""
    return torch.where(torch.gt(weights, level, out=mask), weights, weights.new_zeros(()),
                       out=scratch).sum(-1)


def _rounds(weights: torch.Tensor, tokens: torch.Tensor, pivot: torch.Tensor, limit: torch.Tensor,
            settled: torch.Tensor, uniforms: tuple[torch.Tensor, ...], scratch: torch.Tensor,
            mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection rounds after the first: an open row draws from the tokens more likely than
    its last draw (the pivot) and stands when the draw is inside the nucleus."""
    for u in uniforms:
        above = torch.where(torch.gt(weights, pivot, out=mask), weights, weights.new_zeros(()),
                            out=scratch)
        tokens = torch.where(settled, tokens, _inverse_cdf(above, u))
        w_t = weights.gather(1, tokens[:, None])
        inside = _mass_above(weights, w_t, scratch, mask) < limit
        pivot = torch.where(settled[:, None], pivot, w_t)
        settled = settled | inside
    return tokens, settled


def exact_top_p(weights: torch.Tensor, requests: list[SampleRequest]) -> torch.Tensor:
    """The last resort for a row that `draw`'s rounds left open: the nucleus by a sort of the
    row, drawn at one more uniform of the row's."""
    dev = weights.device
    top_p, u = _to_device([[r.params.top_p for r in requests],
                           [round_uniforms(round_uniforms(r.u)[1])[0] for r in requests]],
                          torch.float32, dev).unbind(0)
    values, order = torch.sort(weights, dim=-1, descending=True)
    cum = torch.cumsum(values, dim=-1)
    values = values.masked_fill(cum - values >= top_p[:, None] * cum[:, -1:], 0.0)
    return order.gather(1, _inverse_cdf(values, u)[:, None])[:, 0]


INVERSE_CDF_BLOCK = 256  # the inverse CDF scans blocks of this many tokens, then one block


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Column of each row's first entry whose cumulative mass passes u x the row's total: never
    an entry of zero mass. In two levels, so no scan runs over the whole vocabulary (a cumsum
    over [256, 49152] took 157 us on an H100, a sum 25): block sums, the block the target falls
    in, then a scan of that block alone."""
    rows, vocab = probs.shape
    b = INVERSE_CDF_BLOCK
    pad = -vocab % b
    if pad:
        probs = torch.nn.functional.pad(probs, (0, pad))
    blocks = probs.view(rows, -1, b)
    block_cdf = blocks.sum(-1).cumsum(-1)  # [rows, vocab / b]
    target = (u * block_cdf[:, -1])[:, None]
    which = torch.searchsorted(block_cdf, target, right=True).clamp(max=block_cdf.shape[1] - 1)
    before = torch.where(which > 0, block_cdf.gather(1, (which - 1).clamp(min=0)), 0.0)
    inner = blocks.gather(1, which[:, :, None].expand(rows, 1, b))[:, 0].cumsum(-1)  # [rows, b]
    # rounding may put the target at or past the block's own total: stay inside its mass
    rest = torch.minimum((target - before).clamp(min=0.0), inner[:, -1:] * (1 - 2.0 ** -20))
    pick = torch.searchsorted(inner, rest.contiguous(), right=True).clamp(max=b - 1)
    return (which * b + pick)[:, 0]
