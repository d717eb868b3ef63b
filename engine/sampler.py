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

from engine.sampler_keys import _MASK64, SampleRequest, _mix64


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
        requests (temperature 0) and sampled ones share one transfer back; more come only for
        rows whose top-p nucleus is wider than the candidates (see `draw`)."""
        if not requests:
            return []
        sampled = [r for r in requests if r.params.temperature > 0]
        if not sampled:
            return [self.greedy(r.row) for r in requests]
        best, best_lp = self._greedy_pair()
        dev = self.logits.device
        n, m = self.num_rows, len(sampled)
        if m == n and all(r.row == i for i, r in enumerate(sampled)):
            rows, logits, logprobs = None, self.logits, self.logprobs()
        else:
            rows = torch.tensor([r.row for r in sampled], dtype=torch.long).to(dev, non_blocking=True)
            logits, logprobs = self.logits.index_select(0, rows), self.logprobs().index_select(0, rows)
        probs, tokens, exact = draw(logits, sampled)
        # one transfer for every row: greedy pairs, then the sampled ones (token ids are exact
        # in float64), then whether each draw stands
        values = torch.cat([best.double(), best_lp.double(), tokens.double(),
                            logprobs.gather(1, tokens[:, None])[:, 0].double(),
                            exact.double()]).tolist()
        greedy = list(zip(map(int, values[:n]), values[n:2 * n], strict=True))
        drawn = list(zip(map(int, values[2 * n:2 * n + m]), values[2 * n + m:2 * n + 2 * m],
                         strict=True))
        wide = [i for i, ok in enumerate(values[2 * n + 2 * m:]) if not ok]
        if wide:  # a flat row (a random-weight model's are): its nucleus by rejection
            idx = torch.tensor(wide, dtype=torch.long).to(dev)
            again = nucleus_by_rejection(probs.index_select(0, idx), [sampled[i] for i in wide])
            values = torch.cat([again.double(), logprobs.index_select(0, idx).gather(
                1, again[:, None])[:, 0].double()]).tolist()
            for j, i in enumerate(wide):
                drawn[i] = (int(values[j]), values[len(wide) + j])
        it = iter(drawn)
        return [next(it) if r.params.temperature > 0 else greedy[r.row] for r in requests]

    def top_many(self, rows: list[int], ks: list[int]) -> list[list[tuple[int, float]]]:
        """The ks[i] most likely next tokens of rows[i] with their log probabilities, best
        first: one top-k over all the rows (beam candidates of the whole step), one transfer."""
        if not rows:
            return []
        idx = torch.tensor(rows, dtype=torch.long).to(self.logits.device, non_blocking=True)
        values, ids = torch.topk(self.logprobs().index_select(0, idx), max(ks), dim=-1)
        both = torch.stack([ids.double(), values.double()]).tolist()
        return [list(zip(map(int, i[:k]), v[:k], strict=True))
                for i, v, k in zip(both[0], both[1], ks, strict=True)]

    def top(self, row: int, k: int) -> list[tuple[int, float]]:
        """The k most likely next tokens with their log probabilities, best first."""
        return self.top_many([row], [k])[0]


CANDIDATES = 128  # best tokens a top-k / top-p row is drawn from before anything wider
MAX_ROUNDS = 16  # rejection rounds for a wide nucleus before the last resort, a full sort


def round_uniform(u: float, round_: int) -> float:
    """Round r's uniform for a row whose first uniform is u (round 0: u itself)."""
    if round_ == 0:
        return u
    x = _mix64((int(u * (1 << 53)) + round_ * 0x9E3779B97F4A7C15) & _MASK64)
    return (x >> 11) * (1.0 / (1 << 53))


def _host(dev: torch.device, *columns: list[float]) -> list[torch.Tensor]:
    """Per-row parameters, in one small host-to-device copy."""
    return list(torch.tensor(columns, dtype=torch.float32).to(dev, non_blocking=True).unbind(0))


def draw(logits: torch.Tensor, requests: list[SampleRequest]
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token per row of float32 `logits` [rows, vocab], row i under requests[i]: returns
    the rows' probabilities after temperature [rows, vocab], the token ids [rows], and whether
    each draw stands (bool [rows]).

    Temperature scales; top-k keeps the k best (ties with the k-th stay); top-p keeps, of what
    top-k left (renormalised, as HF chains its warpers), the shortest best-first run whose mass
    reaches p (a token stays while the mass before it is below p, so the best always stays);
    then the inverse CDF at the row's `u` picks the token. Rows with neither cut draw from the
    whole vocabulary in its own order: no sort. Rows with a cut draw from their best
    `CANDIDATES` (or k) tokens, one top-k and no sort of the vocabulary: exact whenever the
    top-k or the nucleus lies inside them. A row whose nucleus is wider does not stand; the
    caller draws it again with `nucleus_by_rejection`."""
    rows, vocab = logits.shape
    dev = logits.device
    ks = [r.params.top_k if 0 < r.params.top_k < vocab else vocab for r in requests]
    temps, top_p, k_t, u = _host(dev, [r.params.temperature for r in requests],
                                 [r.params.top_p for r in requests], ks, [r.u for r in requests])
    probs = torch.softmax(logits / temps[:, None], dim=-1)
    plain = [i for i, r in enumerate(requests) if ks[i] == vocab and r.params.top_p >= 1.0]
    stands = torch.ones(rows, dtype=torch.bool, device=dev)
    if len(plain) == rows:
        return probs, _inverse_cdf(probs, u), stands
    width = min(vocab, max([CANDIDATES] + [k for k in ks if k < vocab]))
    values, order = torch.topk(probs, width, dim=-1)  # sorted, best first
    kth = values.gather(1, (k_t.long() - 1).clamp(max=width - 1)[:, None])
    values = values.masked_fill(values < kth, 0.0)
    has_k = k_t <= width
    values = torch.where(has_k[:, None], values / values.sum(-1, keepdim=True), values)
    cum = torch.cumsum(values, dim=-1)
    values = values.masked_fill(cum - values >= top_p[:, None], 0.0)
    stands = has_k | (cum[:, -1] >= top_p)
    tokens = order.gather(1, _inverse_cdf(values, u)[:, None])[:, 0]
    if plain:  # rows without a cut: the whole vocabulary, in its own order
        idx = torch.tensor(plain, dtype=torch.long).to(dev, non_blocking=True)
        tokens = tokens.index_copy(0, idx, _inverse_cdf(probs.index_select(0, idx), u[idx]))
        stands = stands.index_fill(0, idx, True)
    return probs, tokens, stands


def nucleus_by_rejection(probs: torch.Tensor, requests: list[SampleRequest]) -> torch.Tensor:
    """Top-p draws for rows (no top-k) whose nucleus is wider than the candidates, without a
    sort of the vocabulary. Draw from the tokens above a pivot (first: all of them); a draw
    inside the nucleus (the mass of the tokens above it is below p) stands, else its
    probability becomes the pivot and the row draws again. What stands is drawn from the
    nucleus with the right probabilities (rejection from a superset of it), and a flat row is
    done in a round or two. Each round's uniform is hashed from the row's."""
    dev = probs.device
    (top_p,) = _host(dev, [r.params.top_p for r in requests])
    pivot = torch.zeros(len(requests), 1, device=dev)
    tokens = torch.zeros(len(requests), dtype=torch.long, device=dev)
    todo = list(range(len(requests)))
    for round_ in range(MAX_ROUNDS):
        whole = len(todo) == len(requests)
        idx = None if whole else torch.tensor(todo, dtype=torch.long).to(dev)
        p = probs if whole else probs.index_select(0, idx)
        (u,) = _host(dev, [round_uniform(requests[i].u, round_) for i in todo])
        if round_ == MAX_ROUNDS - 1:  # never loop forever: the exact sort settles the rest
            values, order = torch.sort(p, dim=-1, descending=True)
            cum = torch.cumsum(values, dim=-1)
            values = values.masked_fill(cum - values >= top_p[idx][:, None], 0.0)
            drawn = order.gather(1, _inverse_cdf(values, u)[:, None])[:, 0]
        else:
            piv = pivot if whole else pivot.index_select(0, idx)
            drawn = _inverse_cdf(p if round_ == 0 else torch.where(p > piv, p, 0.0), u)
        p_t = p.gather(1, drawn[:, None])
        ok = torch.where(p > p_t, p, 0.0).sum(-1) < (top_p if whole else top_p[idx])
        if whole:
            tokens, pivot = drawn, p_t
        else:
            tokens, pivot = tokens.index_copy(0, idx, drawn), pivot.index_copy(0, idx, p_t)
        flags = ok.tolist()
        todo = [i for i, f in zip(todo, flags, strict=True) if not f and round_ < MAX_ROUNDS - 1]
        if not todo:
            break
    return tokens


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Column of each row's first entry whose cumulative mass passes u x the row's total: never
    an entry of zero mass."""
    cdf = torch.cumsum(probs, dim=-1)
    pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None].contiguous(), right=True)
    return pick[:, 0].clamp(max=cdf.shape[1] - 1)
