"""Next-token choice from real logits for a whole batch at once: greedy, temperature, top-k,
top-p, per-request seeds; beam candidates.

`TorchScores` wraps one step's logits (one row per sequence that ran). Every sampled row of the
step is drawn on the device and read back in one transfer, so a step does not sync once per
sequence (`torch.multinomial` row by row did, twice). On a GPU with Triton the draw is one fused
kernel (`paged_kernels.sampling`); elsewhere it is the plain-torch `draw` (engine/runtime/draw.py),
whose full-vocabulary temporaries live in a `SamplerWorkspace` reused from step to step.

Seeds without generators: a sampled token is the inverse CDF of the row's (temperature-scaled,
top-k / top-p filtered) distribution at one uniform number `u`. `u` is a counter-based hash of
(request seed, sample index within the request, output position), computed on the host
(`sample_uniform`), so a seeded request draws the same tokens whatever else is in the batch,
whatever row it lands in, and after a preemption; no RNG state lives between steps.

The pieces live beside this file: draw.py (the draw's arithmetic), row_reductions.py (argmax,
greedy choice, top-k values), sampler_workspace.py, transfer.py. Their names that callers
(tests, benchmarks) import from here stay importable from here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from engine.core.sampler_keys import SampleRequest
from engine.runtime.draw import (
    draw,
    exact_top_p,
    kth_scores,
    params_to_device,
    round_uniforms,
    round_uniforms_many,
    tempered_weights,
)
from engine.runtime.row_reductions import greedy_pair, row_argmax, row_max, token_logprobs, top_values
from engine.runtime.sampler_workspace import SamplerWorkspace, scratch
from engine.runtime.step_picks import PinnedPairs, StepPicks
from engine.runtime.transfer import to_device

# The names callers have imported from this module (the last three under their old private
# names, which tests of the CPU paths use).
_row_argmax, _top_values, _kth_scores = row_argmax, top_values, kth_scores
__all__ = ["SamplerWorkspace", "TorchScores", "draw", "exact_top_p", "fused_sampling_available",
           "greedy_pair", "round_uniforms", "round_uniforms_many", "to_device", "_row_argmax",
           "_top_values", "_kth_scores"]

# what a draw hands back for the rows it left open: (their tokens, log probs) by `exact_top_p`
Redraw = Callable[[list[int]], tuple[torch.Tensor, torch.Tensor]]
Drawn = tuple[torch.Tensor, torch.Tensor, torch.Tensor, Redraw]  # tokens, log probs, settled


def fused_sampling_available(device: torch.device) -> bool:
    """Whether the fused Triton kernel draws on `device`: CUDA with triton installed."""
    return device.type == "cuda" and _triton_installed()


@functools.cache
def _triton_installed() -> bool:
    """Looked up once: a scores object is made every step."""
    from paged_kernels import triton_available

    return triton_available()


class TorchScores:
    """A step's scores as real logits on this process's device (the `Scores` contract of
    engine/runtime/protocols.py)."""

    can_overlap = True  # picks can stay on the device for the next step to read (pick_rows)
    has_argmax = True  # a greedy row is its argmax: it draws no uniform

    def __init__(self, logits: torch.Tensor, logprobs: torch.Tensor | None = None,
                 greedy: tuple[torch.Tensor, torch.Tensor] | None = None,
                 workspace: SamplerWorkspace | None = None, fused: bool | None = None,
                 rows: list[int] | None = None, accepted: torch.Tensor | None = None) -> None:
        """`logits` [rows, vocab], float32 or bfloat16. `logprobs` and `greedy` (token ids,
        their log probs): already computed on the device (by the decode graph), when they were.
        `workspace`: scratch reused across steps (the torch path). `fused`: draw with the Triton
        kernel; None = where it runs natively (CUDA); True on a CPU needs TRITON_INTERPRET=1.
        `rows`: where the engine's row i lies among the logits' rows (a verification step's
        drafts are padded to one length); None: row i is row i. `accepted`: per sequence of a
        verification step, how many of its draft tokens the greedy picks confirm (the decode
        graph decides it on the device; it comes back with the greedy picks)."""
        self._map = rows
        self._accepted_t = accepted
        self._accepted: list[int] | None = None
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
        if self._scratch_lp is None or not self.workspace.owns(self):
            self.workspace.take(self)
            buf = scratch(self.workspace, "logprobs", self.logits)
            self._scratch_lp = torch.log_softmax(self.logits, dim=-1, out=buf)
        return self._scratch_lp

    def _greedy_pair(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._greedy_tensors is None:
            if self.fused and self._logprobs is None:  # a GPU: no log_softmax over the vocabulary
                self._greedy_tensors = greedy_pair(self.logits)
            else:
                lp = self._step_logprobs()
                best = row_argmax(lp)
                self._greedy_tensors = best, lp.gather(1, best[:, None])[:, 0]
        return self._greedy_tensors

    def greedy(self, row: int) -> tuple[int, float]:
        if self._greedy is None:
            best, best_lp = self._greedy_pair()
            parts = [best.double(), best_lp.double()]
            if self._accepted_t is not None:  # in the same transfer
                parts.append(self._accepted_t.double())
            values = torch.cat(parts).tolist()
            n = best.shape[0]
            self._greedy = list(zip(map(int, values[:n]), values[n:2 * n], strict=True))
            self._accepted = [int(v) for v in values[2 * n:]] if self._accepted_t is not None else None
        return self._greedy[row if self._map is None else self._map[row]]

    def accepted(self, index: int) -> int | None:
        """How many draft tokens of the step's sequence `index` its greedy picks confirm, as the
        device decided it; None where the device did not (the host compares the picks)."""
        if self._accepted_t is None:
            return None
        if self._greedy is None:
            self.greedy(0)
        return self._accepted[index]

    def _mapped(self, requests: list[SampleRequest]) -> list[SampleRequest]:
        """The requests with the engine's rows turned into rows of the logits."""
        m = self._map
        return requests if m is None else [r._replace(row=m[r.row]) for r in requests]

    def sample_many(self, requests: list[SampleRequest]) -> list[tuple[int, float]]:
        """(token, its log probability under the model) for each request, in order. Greedy
        requests (temperature 0) and sampled ones share one transfer back; a second comes only
        for the rare row that the rejection rounds could not settle (see `draw`)."""
        if not requests:
            return []
        requests, m, self._map = self._mapped(requests), self._map, None  # rows of the logits now
        try:
            return self._sample_many(requests)
        finally:
            self._map = m

    def _sample_many(self, requests: list[SampleRequest]) -> list[tuple[int, float]]:
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
        if self._map is not None:  # picks by the engine's rows: the next step reads them so
            m = torch.tensor(self._map, dtype=torch.long, device=self._raw.device)
            picks = self._pick_rows(self._mapped(requests))
            return StepPicks(picks.tokens.index_select(0, m), picks.logprobs.index_select(0, m),
                             [r.row for r in requests], self._pinned())
        return self._pick_rows(requests)

    def _pick_rows(self, requests: list[SampleRequest]) -> StepPicks:
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
        return StepPicks(tokens, logprobs, [r.row for r in requests], self._pinned())

    def _pinned(self) -> PinnedPairs | None:
        return None if self.workspace is None else self.workspace.pinned_picks

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
            else row_max(scores)
        weights, tokens, settled = draw(scores, sampled, top, self.workspace)

        def again(open_rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
            idx = to_device(open_rows, torch.long, tokens.device)
            got = exact_top_p(weights.index_select(0, idx), [sampled[i] for i in open_rows])
            return got, scores.index_select(0, idx).gather(1, got[:, None])[:, 0]

        return tokens, scores.gather(1, tokens[:, None])[:, 0], settled, again

    def _draw_fused(self, sampled: list[SampleRequest]) -> Drawn:
        """(tokens, their log probs, settled, the draw for open rows) by the fused Triton
        kernel: one launch, after a top-k over the rows when some row cuts to its k best."""
        from paged_kernels import sampling

        vocab = self._raw.shape[1]
        need_p = any(r.params.top_p < 1.0 for r in sampled)
        params = params_to_device([[float(r.row) for r in sampled]], sampled, need_p,
                                   self._raw.device)
        kth = kth_scores(self._raw, sampled) if any(0 < r.params.top_k < vocab for r in sampled) \
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
        got = exact_top_p(tempered_weights(scores, row_max(scores), temps, k_t, ks, None), reqs)
        return got, token_logprobs(scores, got)

    def top_many(self, rows: list[int], ks: list[int]) -> list[list[tuple[int, float]]]:
        """The ks[i] most likely next tokens of rows[i] with their log probabilities, best
        first: one top-k over all the rows (beam candidates of the whole step), one transfer."""
        if not rows:
            return []
        if self._map is not None:
            rows = [self._map[r] for r in rows]
        idx = to_device(rows, torch.long, self.logits.device)
        values, ids = torch.topk(self.logprobs().index_select(0, idx), max(ks), dim=-1)
        both = torch.stack([ids.double(), values.double()]).tolist()
        return [list(zip(map(int, i[:k]), v[:k], strict=True))
                for i, v, k in zip(both[0], both[1], ks, strict=True)]

    def top(self, row: int, k: int) -> list[tuple[int, float]]:
        """The k most likely next tokens with their log probabilities, best first."""
        return self.top_many([row], [k])[0]


