"""Triton: one step's sampled tokens in one launch (the GPU path of `engine.runtime.sampler`).

`engine.runtime.sampler.draw` in plain torch is about fifty launches and several full passes over
[rows, vocab]. Here one program per sampled row loops over its row of logits in chunks of
BLOCK tokens and does all of it:

1. the row's maximum m;
2. Σ exp(s - m) (for the token's log probability under the model, untempered) and the total of
   the tempered weights w = exp((s - m) / T), zero below the row's top-k cut;
3. the inverse CDF at u x total, in vocabulary order: chunk sums until the chunk that holds the
   target, then a `tl.cumsum` of that chunk alone (never a token of zero weight);
4. top-p by rejection, as `draw` does: the draw stands when the mass of the tokens more likely
   than it is below top_p x total; else its weight becomes the pivot and the row draws again
   among the tokens above it, at the row's next uniform (three rounds in all). A row still open
   after them comes back with settled = False and the host draws it with `exact_top_p`.

Inputs are float32 or bfloat16 logits (read as float32, no copy), so a sampled step needs no
log_softmax over the vocabulary. Outputs stay on the device (no sync): token ids (int64), their
log probabilities (float32) and the settled flags (bool).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["sample", "warm_up", "PARAM_ROWS"]

# The per-row parameters, one float32 row each of a [PARAM_ROWS, rows] tensor (one transfer):
# logits row, temperature, top_p, and the uniforms of the first draw and of rounds 1 and 2.
PARAM_ROWS = 6
BLOCK = 2048  # tokens per chunk (at most: a smaller vocabulary takes its next power of two)


@triton.jit
def _weight(s, m, t, w_min):
    """Tempered weight relative to the row's best token (whose weight is 1); 0 below top-k's cut."""
    w = tl.exp((s - m) / t)
    return tl.where(w >= w_min, w, 0.0)


@triton.jit
def _load(row_ptr, start, V, BLOCK: tl.constexpr):
    """One chunk of the row as float32; past the vocabulary -inf (weight 0)."""
    idx = start + tl.arange(0, BLOCK)
    return tl.load(row_ptr + idx, mask=idx < V, other=float("-inf")).to(tl.float32)


@triton.jit
def _row_max(row_ptr, V, BLOCK: tl.constexpr):
    acc = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, V, BLOCK):
        acc = tl.maximum(acc, _load(row_ptr, start, V, BLOCK))
    return tl.max(acc, 0)


@triton.jit
def _row_sums(row_ptr, V, m, t, w_min, BLOCK: tl.constexpr):
    """(Σ exp(s - m), Σ w). The total adds chunk sums in order, exactly as `_mass_above` and the
    scan do, so a target u x total lies inside the mass the scan walks through."""
    e = tl.zeros([BLOCK], tl.float32)
    total = tl.full([], 0.0, tl.float32)
    for start in range(0, V, BLOCK):
        s = _load(row_ptr, start, V, BLOCK)
        e += tl.exp(s - m)
        total += tl.sum(_weight(s, m, t, w_min), 0)
    return tl.sum(e, 0), total


@triton.jit
def _mass_above(row_ptr, V, m, t, w_min, level, BLOCK: tl.constexpr):
    """Σ w over the tokens whose weight is above `level`."""
    mass = tl.full([], 0.0, tl.float32)
    for start in range(0, V, BLOCK):
        w = _weight(_load(row_ptr, start, V, BLOCK), m, t, w_min)
        mass += tl.sum(tl.where(w > level, w, 0.0), 0)
    return mass


@triton.jit
def _last_above(row_ptr, V, m, t, w_min, pivot, BLOCK: tl.constexpr):
    """The last token whose weight is above the pivot (rounding put the target past the mass)."""
    offs = tl.arange(0, BLOCK)
    last = tl.full([], 0, tl.int32)
    for start in range(0, V, BLOCK):
        w = _weight(_load(row_ptr, start, V, BLOCK), m, t, w_min)
        last = tl.maximum(last, tl.max(tl.where(w > pivot, start + offs, 0), 0))
    return last


@triton.jit
def _inverse_cdf(row_ptr, V, m, t, w_min, pivot, target, BLOCK: tl.constexpr):
    """The first token, among those above the pivot, whose cumulative weight passes `target`."""
    offs = tl.arange(0, BLOCK)
    start = tl.full([], 0, tl.int32)
    before = tl.full([], 0.0, tl.float32)
    tok = tl.full([], -1, tl.int32)
    while (start < V) & (tok < 0):  # stops at the chunk that holds the target
        w = _weight(_load(row_ptr, start, V, BLOCK), m, t, w_min)
        w = tl.where(w > pivot, w, 0.0)
        mass = tl.sum(w, 0)
        if before + mass > target:
            cum = tl.cumsum(w, 0)
            # rounding may put the target at or past the chunk's own scan total: stay inside it
            inside = tl.max(cum, 0) * (1.0 - 9.5367431640625e-07)  # 1 - 2^-20
            rest = tl.minimum(tl.maximum(target - before, 0.0), inside)
            # a parallel scan need not be monotone in its last bits: ask for weight > 0 as well,
            # and fall back on the chunk's last token of weight > 0
            first = tl.min(tl.where((cum > rest) & (w > 0.0), offs, BLOCK), 0)
            last = tl.max(tl.where(w > 0.0, offs, -1), 0)
            tok = start + tl.minimum(first, last)
        before += mass
        start += BLOCK
    if tok < 0:
        tok = _last_above(row_ptr, V, m, t, w_min, pivot, BLOCK)
    return tok


@triton.jit(do_not_specialize=["M"])  # one row or many: the same binary
def _sample_kernel(logits_ptr, stride_row, params_ptr, kth_ptr, tok_ptr, lp_ptr, ok_ptr, M, V,
                   BLOCK: tl.constexpr, HAS_TOP_K: tl.constexpr, NEED_P: tl.constexpr):
    i = tl.program_id(0)
    row = tl.load(params_ptr + i).to(tl.int64)
    t = tl.load(params_ptr + M + i)
    top_p = tl.load(params_ptr + 2 * M + i)
    row_ptr = logits_ptr + row * stride_row
    m = _row_max(row_ptr, V, BLOCK)
    if HAS_TOP_K:  # the k-th best score's weight: tokens below it weigh 0, ties with it stay
        w_min = tl.exp((tl.load(kth_ptr + i) - m) / t)
    else:
        w_min = tl.full([], 0.0, tl.float32)
    sum_exp, total = _row_sums(row_ptr, V, m, t, w_min, BLOCK)
    tok = _inverse_cdf(row_ptr, V, m, t, w_min, -1.0, tl.load(params_ptr + 3 * M + i) * total, BLOCK)
    s_t = tl.load(row_ptr + tok).to(tl.float32)
    settled = top_p >= 1.0
    if NEED_P:
        if top_p < 1.0:
            limit = top_p * total
            w_t = _weight(s_t, m, t, w_min)
            above = _mass_above(row_ptr, V, m, t, w_min, w_t, BLOCK)
            for r in tl.static_range(2):
                if above >= limit:  # outside the nucleus: draw again above this draw's weight
                    u = tl.load(params_ptr + (4 + r) * M + i)
                    tok = _inverse_cdf(row_ptr, V, m, t, w_min, w_t, u * above, BLOCK)
                    s_t = tl.load(row_ptr + tok).to(tl.float32)
                    w_t = _weight(s_t, m, t, w_min)
                    above = _mass_above(row_ptr, V, m, t, w_min, w_t, BLOCK)
            settled = above < limit
    tl.store(tok_ptr + i, tok.to(tl.int64))
    tl.store(lp_ptr + i, s_t - m - tl.log(sum_exp))
    tl.store(ok_ptr + i, settled)


def sample(logits: torch.Tensor, params: torch.Tensor, kth: torch.Tensor | None = None,
           need_p: bool = True, block: int | None = None
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draw one token for each column of `params` ([PARAM_ROWS, n] float32, on the logits'
    device; rows as above) from `logits` [rows, vocab] (float32 or bfloat16, unit stride along
    the vocabulary). `kth` [n]: each row's k-th best score (-inf: no top-k cut). `need_p`: some
    row has top_p < 1 (else the nucleus code is not compiled in). Returns (token ids int64,
    log probabilities float32, settled bool), each [n], on the device; nothing waits for it."""
    assert logits.dim() == 2 and logits.stride(1) == 1, "rows of contiguous logits"
    assert params.shape[0] == PARAM_ROWS and params.dtype == torch.float32 and params.is_contiguous()
    n = params.shape[1]
    dev = logits.device
    tokens = torch.empty(n, dtype=torch.int64, device=dev)
    logprobs = torch.empty(n, dtype=torch.float32, device=dev)
    settled = torch.empty(n, dtype=torch.bool, device=dev)
    if n == 0:
        return tokens, logprobs, settled
    block = min(block or BLOCK, triton.next_power_of_2(logits.shape[1]))
    _sample_kernel[(n,)](logits, logits.stride(0), params, kth if kth is not None else params,
                         tokens, logprobs, settled, n, logits.shape[1], BLOCK=block,
                         HAS_TOP_K=kth is not None, NEED_P=need_p,
                         num_warps=8 if block >= 2048 else 4)
    return tokens, logprobs, settled


def warm_up(vocab: int, device: torch.device) -> None:
    """Compile the kernel's four variants (top-k or not, top-p or not) for float32 logits now,
    so that no user's first sampled step waits for the compiler."""
    logits = torch.zeros(2, vocab, device=device)
    params = torch.tensor([[0, 1], [1.0, 1.0], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]],
                          device=device)
    kth = torch.zeros(2, device=device)
    for top_k in (None, kth):
        for need_p in (False, True):
            sample(logits, params, top_k, need_p)
