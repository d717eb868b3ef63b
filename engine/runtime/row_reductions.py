"""Row reductions over a step's logits without a log_softmax over the vocabulary: each row's
maximum, argmax, greedy choice and its log probability, a token's log probability, the top-k
values. On a CPU through the maxima of blocks of ARGMAX_BLOCK columns (an argmax or a top-k
over 49,152 columns is slow there; an amax per block is not); on a GPU torch's own.
"""

from __future__ import annotations

import torch

ARGMAX_BLOCK = 256  # a CPU's argmax over 49,152 columns is slow; an amax per block is not


def block_max(x: torch.Tensor) -> torch.Tensor:
    """[rows, blocks]: the maximum of each run of ARGMAX_BLOCK columns (the last may be short)."""
    rows, vocab = x.shape
    b = ARGMAX_BLOCK
    full = vocab // b * b
    parts = [x[:, :full].view(rows, -1, b).amax(-1)] if full else []
    if full < vocab:
        parts.append(x[:, full:].amax(-1, keepdim=True))
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def row_max(x: torch.Tensor) -> torch.Tensor:
    return block_max(x).amax(-1) if x.device.type == "cpu" else x.amax(-1)


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """Each row's first column holding its maximum, as torch.argmax. On a CPU through the block
    maxima: the first block that holds the maximum, then an argmax inside that block alone."""
    if x.device.type != "cpu":
        return x.argmax(-1)
    rows, vocab = x.shape
    b = ARGMAX_BLOCK
    which = block_max(x).argmax(-1, keepdim=True)  # the first block holding the row's maximum
    # the short last block's columns are clamped: repeats of its last column come after it
    cols = (which * b + torch.arange(b, device=x.device)).clamp(max=vocab - 1)
    return (which[:, 0] * b + x.gather(1, cols).argmax(-1))


def log_sum_exp(x: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """log Σ exp(x - top) per row (`top` the row maximum)."""
    return (x - top[:, None]).exp_().sum(-1).log_()


def greedy_pair(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's most likely token and its log probability, -log Σ exp(s - max): an argmax and
    a sum of exponentials, no log_softmax tensor kept (what a decode graph captures)."""
    best = row_argmax(logits)
    top = logits.gather(1, best[:, None])[:, 0]
    return best, log_sum_exp(logits, top).neg_()


def token_logprobs(scores: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(scores)[token] per row, without the full log_softmax."""
    top = row_max(scores)
    return scores.gather(1, tokens[:, None])[:, 0] - top - log_sum_exp(scores, top)


def top_values(x: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest values of each row, largest first (torch.topk's values). On a CPU from the
    k blocks with the largest maxima alone: the k largest values all lie there (a value in any
    other block is below k block maxima), and a top-k over 50 x 256 columns is a quarter of
    one over 49,152."""
    rows, vocab = x.shape
    b = ARGMAX_BLOCK
    if x.device.type != "cpu" or vocab % b or k * b >= vocab:
        return torch.topk(x, k, dim=-1).values
    nb = vocab // b
    blocks = torch.topk(block_max(x), k, dim=-1).indices  # [rows, k]
    blocks += torch.arange(0, rows * nb, nb, device=x.device)[:, None]  # ids in x's flat blocks
    # whole blocks copied as rows (a gather of single columns costs three times as much)
    picked = x.reshape(rows * nb, b).index_select(0, blocks.view(-1)).view(rows, k * b)
    return torch.topk(picked, k, dim=-1).values

