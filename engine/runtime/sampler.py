"""Next-token choice from real logits for a whole batch at once: greedy, temperature, top-k,
top-p, per-request seeds; beam candidates.

Wraps one step's logits (one row per sequence that ran). Every sampled row of the step is drawn
on the device and read back in one transfer, so a step does not sync once per sequence
(`torch.multinomial` row by row did, twice). On a GPU with Triton the draw is one fused kernel
(`kernels.sampling`); elsewhere it is the plain-torch `draw` below, whose full-vocabulary
temporaries live in a `SamplerWorkspace` reused from step to step.

Seeds without generators: a sampled token is the inverse CDF of the row's (temperature-scaled,
top-k / top-p filtered) distribution at one uniform number `u`. `u` is a counter-based hash of
(request seed, sample index within the request, output position), computed on the host
(`sample_uniform`), so a seeded request draws the same tokens whatever else is in the batch,
whatever row it lands in, and after a preemption; no RNG state lives between steps.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import torch

from engine.core.sampler_keys import SampleRequest, _mix64, mix64_array
from engine.runtime.step_picks import StepPicks

# what a draw hands back for the rows it left open: (their tokens, log probs) by `exact_top_p`
Redraw = Callable[[list[int]], tuple[torch.Tensor, torch.Tensor]]
Drawn = tuple[torch.Tensor, torch.Tensor, torch.Tensor, Redraw]  # tokens, log probs, settled


class SamplerWorkspace:
    """Full-vocabulary scratch tensors kept from one step to the next. On a CPU every new
    [256, 49152] float32 tensor is 50 MB of fresh pages, and faulting them in costs more than
    the arithmetic done on them. Owned by whatever makes the steps' scores (the model runner)
    and used by one step's scores at a time: `owner` names the scores object whose tensors are
    in it now, so a stale one never trusts what it left there."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}
        self.owner: object | None = None

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype,
            device: torch.device) -> torch.Tensor:
        """Buffer `name` viewed as `shape` (uninitialised); grown, never shrunk."""
        n = math.prod(shape)
        key = (name, dtype, torch.device(device))
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < n:
            buf = self._buffers[key] = torch.empty(n, dtype=dtype, device=device)
        return buf[:n].view(shape)


def _scratch(workspace: SamplerWorkspace | None, name: str, like: torch.Tensor,
             dtype: torch.dtype | None = None) -> torch.Tensor:
    dtype = dtype or like.dtype
    if workspace is None:
        return torch.empty(like.shape, dtype=dtype, device=like.device)
    return workspace.get(name, tuple(like.shape), dtype, like.device)


def fused_sampling_available(device: torch.device) -> bool:
    """Whether the fused Triton kernel draws on `device`: CUDA with triton installed."""
    return device.type == "cuda" and _triton_installed()


@functools.cache
def _triton_installed() -> bool:
    """Looked up once: a scores object is made every step."""
    from kernels import triton_available

    return triton_available()


class TorchScores:
    def __init__(self, logits: torch.Tensor, logprobs: torch.Tensor | None = None,
                 greedy: tuple[torch.Tensor, torch.Tensor] | None = None,
                 workspace: SamplerWorkspace | None = None, fused: bool | None = None) -> None:
        """`logits` [rows, vocab], float32 or bfloat16. `logprobs` and `greedy` (token ids,
        their log probs): already computed on the device (by the decode graph), when they were.
        `workspace`: scratch reused across steps (the torch path). `fused`: draw with the Triton
        kernel; None = where it runs natively (CUDA); True on a CPU needs TRITON_INTERPRET=1."""
        self._raw = logits
        self._logits: torch.Tensor | None = None
        self.num_rows = logits.shape[0]
        self._logprobs = logprobs
        self._scratch_lp: torch.Tensor | None = None  # log_softmax in the workspace
        self._greedy_tensors = greedy
        self._greedy: list[tuple[int, float]] | None = None
        self.workspace = workspace
        self.fused = fused_sampling_available(logits.device) if fused is None else fused

    @property
    def logits(self) -> torch.Tensor:
        """The logits as float32 (a bfloat16 step is converted once, when something asks)."""
        if self._logits is None:
            self._logits = self._raw.float()
        return self._logits

    def logprobs(self) -> torch.Tensor:
        """log_softmax of every row: a tensor of its own, valid as long as this object."""
        if self._logprobs is None:
            self._logprobs = torch.log_softmax(self.logits, dim=-1)
        return self._logprobs

    def _step_logprobs(self) -> torch.Tensor:
        """log_softmax of every row for this call's use: in the workspace when there is one
        (no fresh pages), reused while no other scores object has used the workspace since."""
        if self._logprobs is not None or self.workspace is None:
            return self.logprobs()
        if self._scratch_lp is None or self.workspace.owner is not self:
            self.workspace.owner = self
            buf = _scratch(self.workspace, "logprobs", self.logits)
            self._scratch_lp = torch.log_softmax(self.logits, dim=-1, out=buf)
        return self._scratch_lp

    def _greedy_pair(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._greedy_tensors is None:
            if self.fused and self._logprobs is None:  # a GPU: no log_softmax over the vocabulary
                self._greedy_tensors = greedy_pair(self.logits)
            else:
                lp = self._step_logprobs()
                best = _row_argmax(lp)
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
        for the rare row that the rejection rounds could not settle (see `draw`)."""
        if not requests:
            return []
        sampled = [r for r in requests if r.params.temperature > 0]
        if not sampled:
            return [self.greedy(r.row) for r in requests]
        n, m = self.num_rows, len(sampled)
        head = list(self._greedy_pair()) if m < len(requests) else []
        draw_rows = self._draw_fused if self.fused else self._draw_torch
        tokens, token_lp, settled, again = draw_rows(sampled)
        # one transfer for every row: greedy pairs when some row is greedy, then the sampled
        # ones (token ids are exact in float64), then whether each draw stands
        values = torch.cat([t.double() for t in (*head, tokens, token_lp, settled)]).tolist()
        g = 2 * n if head else 0
        greedy = list(zip(map(int, values[:n]), values[n:g], strict=True)) if head else []
        drawn = list(zip(map(int, values[g:g + m]), values[g + m:g + 2 * m], strict=True))
        open_rows = [i for i, ok in enumerate(values[g + 2 * m:]) if not ok]
        if open_rows:  # rare: a row whose rejection rounds all missed the nucleus
            got, got_lp = again(open_rows)
            values = torch.cat([got.double(), got_lp.double()]).tolist()
            for j, i in enumerate(open_rows):
                drawn[i] = (int(values[j]), values[len(open_rows) + j])
        it = iter(drawn)
        return [next(it) if r.params.temperature > 0 else greedy[r.row] for r in requests]

    def pick_rows(self, requests: list[SampleRequest]) -> StepPicks:
        """`sample_many` for async scheduling, with nothing read back yet: one pick per row
        (greedy, or the row's draw), left on the device. Only for requests whose draws always
        settle at once (no top-p: its rare unsettled rows need the host)."""
        sampled = [r for r in requests if r.params.temperature > 0]
        if len(sampled) < len(requests):  # some row is greedy: start from the greedy picks
            best, best_lp = self._greedy_pair()
            tokens, logprobs = best.clone(), best_lp.clone().float()
        else:
            dev = self._raw.device
            tokens = torch.zeros(self.num_rows, dtype=torch.long, device=dev)
            logprobs = torch.zeros(self.num_rows, dtype=torch.float32, device=dev)
        if sampled:
            drawn, drawn_lp, _, _ = (self._draw_fused if self.fused else self._draw_torch)(sampled)
            rows = to_device([r.row for r in sampled], torch.long, tokens.device)
            tokens.index_copy_(0, rows, drawn)
            logprobs.index_copy_(0, rows, drawn_lp.float())
        return StepPicks(tokens, logprobs, [r.row for r in requests])

    def _select(self, scores: torch.Tensor, requests: list[SampleRequest]) -> torch.Tensor:
        """The requests' rows of `scores`: `scores` itself when they are all its rows, in order."""
        if len(requests) == scores.shape[0] and all(r.row == i for i, r in enumerate(requests)):
            return scores
        return scores.index_select(0, to_device([r.row for r in requests], torch.long, scores.device))

    def _draw_torch(self, sampled: list[SampleRequest]) -> Drawn:
        """(tokens, their log probs, settled, the draw for open rows) by the plain-torch `draw`
        over the log probabilities, with the workspace's buffers."""
        lp = self._step_logprobs()
        scores = self._select(lp, sampled)
        top = self._greedy_tensors[1] if scores is lp and self._greedy_tensors is not None \
            else _row_max(scores)
        weights, tokens, settled = draw(scores, sampled, top, self.workspace)

        def again(open_rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
            idx = to_device(open_rows, torch.long, tokens.device)
            got = exact_top_p(weights.index_select(0, idx), [sampled[i] for i in open_rows])
            return got, scores.index_select(0, idx).gather(1, got[:, None])[:, 0]

        return tokens, scores.gather(1, tokens[:, None])[:, 0], settled, again

    def _draw_fused(self, sampled: list[SampleRequest]) -> Drawn:
        """(tokens, their log probs, settled, the draw for open rows) by the fused Triton
        kernel: one launch, after a top-k over the rows when some row cuts to its k best."""
        from kernels import sampling

        vocab = self._raw.shape[1]
        need_p = any(r.params.top_p < 1.0 for r in sampled)
        params = _paramsto_device([[float(r.row) for r in sampled]], sampled, need_p,
                                   self._raw.device)
        kth = _kth_scores(self._raw, sampled) if any(0 < r.params.top_k < vocab for r in sampled) \
            else None
        logits = self._raw if self._raw.stride(1) == 1 else self._raw.contiguous()
        return (*sampling.sample(logits, params, kth, need_p), lambda rows: self._exact(sampled, rows))

    def _exact(self, sampled: list[SampleRequest], open_rows: list[int]
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """`exact_top_p` for rows the fused kernel left open, from the weights `draw` gives."""
        reqs = [sampled[i] for i in open_rows]
        scores = self._select(self.logits, reqs)
        vocab = scores.shape[1]
        ks = [r.params.top_k if 0 < r.params.top_k < vocab else vocab for r in reqs]
        temps, k_t = to_device([[r.params.temperature for r in reqs], ks], torch.float32,
                                scores.device).unbind(0)
        got = exact_top_p(_weights(scores, _row_max(scores), temps, k_t, ks, None), reqs)
        return got, _token_logprobs(scores, got)

    def top_many(self, rows: list[int], ks: list[int]) -> list[list[tuple[int, float]]]:
        """The ks[i] most likely next tokens of rows[i] with their log probabilities, best
        first: one top-k over all the rows (beam candidates of the whole step), one transfer."""
        if not rows:
            return []
        idx = to_device(rows, torch.long, self.logits.device)
        values, ids = torch.topk(self.logprobs().index_select(0, idx), max(ks), dim=-1)
        both = torch.stack([ids.double(), values.double()]).tolist()
        return [list(zip(map(int, i[:k]), v[:k], strict=True))
                for i, v, k in zip(both[0], both[1], ks, strict=True)]

    def top(self, row: int, k: int) -> list[tuple[int, float]]:
        """The k most likely next tokens with their log probabilities, best first."""
        return self.top_many([row], [k])[0]


def to_device(values: list | np.ndarray, dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
    """A small host list or array on the device without a sync: from pinned memory on a GPU (a
    copy from pageable memory may wait for the stream, i.e. for the whole forward pass)."""
    t = torch.as_tensor(values, dtype=dtype)
    if dev.type == "cuda":
        t = t.pin_memory()
    return t.to(dev, non_blocking=True)


def _paramsto_device(first: list[list[float]], requests: list[SampleRequest], need_p: bool,
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
    by `exact_top_p`. `kernels.sampling` does the same in one kernel."""
    rows, vocab = scores.shape
    dev = scores.device
    ks = [r.params.top_k if 0 < r.params.top_k < vocab else vocab for r in requests]
    need_p = any(r.params.top_p < 1.0 for r in requests)
    k_t, temps, top_p, u0, u1, u2 = _paramsto_device([ks], requests, need_p, dev).unbind(0)
    top = _row_max(scores) if row_max is None else row_max
    weights = _weights(scores, top, temps, k_t, ks, workspace)
    tokens, total = _inverse_cdf(weights, u0)
    if not need_p:
        return weights, tokens, torch.ones(rows, dtype=torch.bool, device=dev)
    limit = top_p * total  # the total from the scan's block sums: no pass of its own
    scratch = _scratch(workspace, "scratch", weights)
    w_t = weights.gather(1, tokens[:, None])
    settled = (top_p >= 1.0) | (_mass_above(weights, w_t, scratch) < limit)
    if dev.type != "cpu":  # rounds for every row: reading which are open would sync
        return (weights, *_rounds(weights, tokens, w_t, limit, settled, (u1, u2), scratch))
    # on a CPU there is nothing to keep busy: the later rounds run for the open rows alone
    open_rows = (~settled).nonzero()[:, 0]
    if len(open_rows):
        sub = weights.index_select(0, open_rows)
        got, ok = _rounds(sub, tokens[open_rows], w_t[open_rows], limit[open_rows],
                          settled[open_rows], (u1[open_rows], u2[open_rows]), torch.empty_like(sub))
        tokens = tokens.index_copy(0, open_rows, got)
        settled = settled.index_copy(0, open_rows, ok)
    return weights, tokens, settled


def _weights(scores: torch.Tensor, top: torch.Tensor, temps: torch.Tensor, k_t: torch.Tensor,
             ks: list[int], workspace: SamplerWorkspace | None) -> torch.Tensor:
    """exp((score - row max) / T), zero below the row's k-th largest (ks[i] = vocab: no cut)."""
    vocab = scores.shape[1]
    weights = torch.sub(scores, top[:, None], out=_scratch(workspace, "weights", scores))
    weights.div_(temps[:, None]).exp_()
    if any(k < vocab for k in ks):
        kth = _top_values(weights, max(k for k in ks if k < vocab))
        kth = kth.gather(1, (k_t.long() - 1).clamp(max=kth.shape[1] - 1)[:, None])
        kth = torch.where(k_t[:, None] < vocab, kth, 0.0)  # a row that cuts nothing keeps all
        # weights below the cut times 0.0: a float comparison, no bool tensor (see `_above`)
        weights.mul_(torch.ge(weights, kth, out=_scratch(workspace, "scratch", weights)))
    return weights


def _top_values(x: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest values of each row, largest first (torch.topk's values). On a CPU from the
    k blocks with the largest maxima alone: the k largest values all lie there (a value in any
    other block is below k block maxima), and a top-k over 50 x 256 columns is a quarter of
    one over 49,152."""
    rows, vocab = x.shape
    b = ARGMAX_BLOCK
    if x.device.type != "cpu" or vocab % b or k * b >= vocab:
        return torch.topk(x, k, dim=-1).values
    nb = vocab // b
    blocks = torch.topk(_block_max(x), k, dim=-1).indices  # [rows, k]
    blocks += torch.arange(0, rows * nb, nb, device=x.device)[:, None]  # ids in x's flat blocks
    # whole blocks copied as rows (a gather of single columns costs three times as much)
    picked = x.reshape(rows * nb, b).index_select(0, blocks.view(-1)).view(rows, k * b)
    return torch.topk(picked, k, dim=-1).values


def _kth_scores(logits: torch.Tensor, requests: list[SampleRequest]) -> torch.Tensor:
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
        drawn = _inverse_cdf(_above(weights, pivot, scratch), u)[0]
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
    return order.gather(1, _inverse_cdf(values, u)[0][:, None])[:, 0]


INVERSE_CDF_BLOCK = 256  # the inverse CDF scans blocks of this many tokens, then one block


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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


# ---- the greedy choice and log probabilities, without a log_softmax over the vocabulary ----

ARGMAX_BLOCK = 256  # a CPU's argmax over 49,152 columns is slow; an amax per block is not


def _block_max(x: torch.Tensor) -> torch.Tensor:
    """[rows, blocks]: the maximum of each run of ARGMAX_BLOCK columns (the last may be short)."""
    rows, vocab = x.shape
    b = ARGMAX_BLOCK
    full = vocab // b * b
    parts = [x[:, :full].view(rows, -1, b).amax(-1)] if full else []
    if full < vocab:
        parts.append(x[:, full:].amax(-1, keepdim=True))
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def _row_max(x: torch.Tensor) -> torch.Tensor:
    return _block_max(x).amax(-1) if x.device.type == "cpu" else x.amax(-1)


def _row_argmax(x: torch.Tensor) -> torch.Tensor:
    """Each row's first column holding its maximum, as torch.argmax. On a CPU through the block
    maxima: the first block that holds the maximum, then an argmax inside that block alone."""
    if x.device.type != "cpu":
        return x.argmax(-1)
    rows, vocab = x.shape
    b = ARGMAX_BLOCK
    which = _block_max(x).argmax(-1, keepdim=True)  # the first block holding the row's maximum
    # the short last block's columns are clamped: repeats of its last column come after it
    cols = (which * b + torch.arange(b, device=x.device)).clamp(max=vocab - 1)
    return (which[:, 0] * b + x.gather(1, cols).argmax(-1))


def _log_sum_exp(x: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """log Σ exp(x - top) per row (`top` the row maximum)."""
    return (x - top[:, None]).exp_().sum(-1).log_()


def greedy_pair(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's most likely token and its log probability, -log Σ exp(s - max): an argmax and
    a sum of exponentials, no log_softmax tensor kept (what a decode graph captures)."""
    best = _row_argmax(logits)
    top = logits.gather(1, best[:, None])[:, 0]
    return best, _log_sum_exp(logits, top).neg_()


def _token_logprobs(scores: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(scores)[token] per row, without the full log_softmax."""
    top = _row_max(scores)
    return scores.gather(1, tokens[:, None])[:, 0] - top - _log_sum_exp(scores, top)
