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

from engine.sampler_keys import SampleRequest


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
        requests (temperature 0) and sampled ones share the one transfer back."""
        if not requests:
            return []
        sampled = [r for r in requests if r.params.temperature > 0]
        if not sampled:
            return [self.greedy(r.row) for r in requests]
        best, best_lp = self._greedy_pair()
        dev = self.logits.device
        rows = torch.tensor([r.row for r in sampled], dtype=torch.long).to(dev, non_blocking=True)
        tokens = sample_rows(self.logits.index_select(0, rows), sampled)
        logprobs = self.logprobs().index_select(0, rows).gather(1, tokens[:, None])[:, 0]
        # one transfer for every row: greedy pairs first, then the sampled ones (token ids are
        # exact in float64)
        flat = torch.cat([best.double(), best_lp.double(), tokens.double(), logprobs.double()])
        values = flat.tolist()
        n, m = self.num_rows, len(sampled)
        greedy = list(zip(map(int, values[:n]), values[n:2 * n], strict=True))
        drawn = iter(zip(map(int, values[2 * n:2 * n + m]), values[2 * n + m:], strict=True))
        return [next(drawn) if r.params.temperature > 0 else greedy[r.row] for r in requests]

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


def sample_rows(logits: torch.Tensor, requests: list[SampleRequest]) -> torch.Tensor:
    """Token ids [rows] drawn from float32 `logits` [rows, vocab], row i under requests[i].

    Temperature scales, top-k keeps the k best (ties at the k-th kept), top-p keeps the
    shortest best-first prefix whose mass reaches p (a token stays when the mass before it is
    below p, so the first always stays), then the inverse CDF at each row's `u` picks the token.
    Full sorts only when some row asks for top-p without a top-k; top-k alone sorts k values."""
    dev, vocab = logits.device, logits.shape[-1]
    temps = torch.tensor([r.params.temperature for r in requests], dtype=torch.float32)
    top_p = torch.tensor([r.params.top_p for r in requests], dtype=torch.float32)
    ks = [r.params.top_k if 0 < r.params.top_k < vocab else vocab for r in requests]
    u = torch.tensor([r.u for r in requests], dtype=torch.float32)
    host = torch.stack([temps, top_p, torch.tensor(ks, dtype=torch.float32), u])
    temps, top_p, k_t, u = host.to(dev, non_blocking=True).unbind(0)  # one small copy
    scaled = logits / temps[:, None]
    need_p = any(r.params.top_p < 1.0 for r in requests)
    width = max(ks)
    if width == vocab and not need_p:  # temperature only: the CDF in vocabulary order
        values, order = scaled, None
    elif width == vocab:
        values, order = torch.sort(scaled, dim=-1, descending=True)
    else:
        values, order = torch.topk(scaled, width, dim=-1)  # sorted, best first
    if order is not None:  # top-k: drop ranks past each row's k (ties with the k-th stay)
        kth = values.gather(1, (k_t.long() - 1).clamp(max=values.shape[1] - 1)[:, None])
        values = values.masked_fill(values < kth, float("-inf"))
    probs = torch.softmax(values, dim=-1)
    if need_p:
        before = torch.cumsum(probs, dim=-1) - probs
        probs = probs.masked_fill(before >= top_p[:, None], 0.0)
    cdf = torch.cumsum(probs, dim=-1)
    target = u * cdf[:, -1]
    # the first rank whose cumulative mass passes the target: never a dropped (zero) token
    pick = torch.searchsorted(cdf, target[:, None], right=True).clamp(max=cdf.shape[1] - 1)
    return pick[:, 0] if order is None else order.gather(1, pick)[:, 0]
