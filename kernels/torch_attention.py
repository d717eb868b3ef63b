"""Paged attention in vectorised plain torch: the CPU backend's attention at serving scale.

Owns `paged_attention`, with exactly the signature of `kernels.reference.paged_attention` (the
loop that stays the tests' oracle) and of the Triton kernel. The loop pays about twenty small
torch calls per sequence per layer; with a few hundred decoding sequences those calls, not the
arithmetic, are the step. Here the work is shaped for batches instead:

- Decode rows (query length 1) of sequences of similar length form one group. A group gathers
  every member's K and V through its block table with ONE `index_select` each, straight into
  `[seqs * kv_heads, max_len, head_dim]`, and attends with two batched matmuls, a length mask
  and a float32 softmax. Grouped-query attention needs no `repeat`: the query heads that share
  a KV head are the rows of one matmul (`[seqs * kv_heads, group, head_dim]`).
- Prefill rows (query length > 1, maybe after a cached prefix) run one sequence at a time
  through the same gather and matmuls, causal within the new tokens and full over the prefix.
  A prefill's matmuls are large, so the per-sequence Python overhead is noise there.

Memory: padding every decode to the batch's longest context would turn one 8,000-token
sequence among short ones into 8,000 gathered rows for everyone. So decodes are grouped by the
power of two of their length (each is padded to less than twice its own length, or to at most
64, and there are only a handful of groups), and a group is split when its gather would pass a
fixed size.
Long prefills attend in query chunks, so their score matrix stays bounded too.

Math in float32 (float64 for float64 inputs), output in q's dtype, as the reference.
"""

from __future__ import annotations

import torch

__all__ = ["paged_attention"]

# Decodes up to this length share one group: padding a short context to 64 keys costs less
# than the ~15 torch calls of another group.
MIN_GROUP_LEN = 64
# Elements of K (and as many of V) that one group may gather: 64 MiB each in float32.
MAX_GATHER_ELEMENTS = 1 << 24
# Elements of one prefill chunk's score matrix [heads, queries, keys]: 64 MiB in float32.
MAX_SCORE_ELEMENTS = 1 << 24


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Causal, grouped-query attention of packed new tokens over their paged context.

    Same contract as `kernels.reference.paged_attention` (see there); the hints are ignored,
    because the decode-graph path passes its capture-time maximum, not this batch's.
    """
    del max_query_len, max_seq_len, num_splits  # launch hints of the Triton path
    out = torch.empty_like(q)
    lens = seq_lens.tolist()  # one host read of the small metadata per call
    starts = query_start_loc.tolist()
    decodes = [i for i in range(len(lens)) if starts[i + 1] - starts[i] == 1]
    per_token = k_cache.shape[2] * k_cache.shape[3]
    for seqs in _decode_groups(decodes, lens, per_token):
        _attend_decodes(q, k_cache, v_cache, block_tables, seqs, lens, starts, scale, out)
    for i, seq_len in enumerate(lens):
        if starts[i + 1] - starts[i] > 1:
            _attend_prefill(q, k_cache, v_cache, block_tables, i, seq_len, starts, scale, out)
    return out


def _decode_groups(seqs: list[int], lens: list[int], per_token: int) -> list[list[int]]:
    """Decode sequences in groups of similar length, each group's gather within the budget."""
    buckets: dict[int, list[int]] = {}
    for i in seqs:
        # Group k holds lengths in (2^(k-1), 2^k]: nobody is padded to twice its own length.
        buckets.setdefault((max(lens[i], MIN_GROUP_LEN) - 1).bit_length(), []).append(i)
    groups: list[list[int]] = []
    for key in sorted(buckets):
        members = buckets[key]
        width = max(lens[i] for i in members)
        size = max(1, MAX_GATHER_ELEMENTS // (width * per_token))
        groups += [members[j:j + size] for j in range(0, len(members), size)]
    return groups


def _attend_decodes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, seqs: list[int], lens: list[int],
                    starts: list[int], scale: float, out: torch.Tensor) -> None:
    """One group of decode rows: one gather of K, one of V, two batched matmuls."""
    device = q.device
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    group = q.shape[1] // num_kv_heads
    rows = torch.tensor([starts[i] for i in seqs], device=device)
    seq_lens = torch.tensor([lens[i] for i in seqs], device=device)
    width = max(lens[i] for i in seqs)
    slots, visible = _slots(block_tables, torch.tensor(seqs, device=device), seq_lens, width,
                            k_cache.shape[1])
    k, v = _gather(k_cache, v_cache, slots, _compute_dtype(q))
    qg = q.index_select(0, rows).to(k.dtype).view(len(seqs), num_kv_heads, group, 1, head_dim)
    o = _attend(qg, k, v, visible[:, None, :], scale)
    out.index_copy_(0, rows, o.view(len(seqs), -1, head_dim).to(out.dtype))


def _attend_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, i: int, seq_len: int, starts: list[int],
                    scale: float, out: torch.Tensor) -> None:
    """Sequence i's new tokens (more than one), in query chunks of bounded score size."""
    device = q.device
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    num_heads = q.shape[1]
    q_start, q_len = starts[i], starts[i + 1] - starts[i]
    slots, _ = _slots(block_tables, torch.tensor([i], device=device),
                      torch.tensor([seq_len], device=device), seq_len, k_cache.shape[1])
    k, v = _gather(k_cache, v_cache, slots, _compute_dtype(q))  # [1, Hkv, seq_len, D]
    chunk = max(1, MAX_SCORE_ELEMENTS // (num_heads * seq_len))
    key_pos = torch.arange(seq_len, device=device)
    for j0 in range(0, q_len, chunk):
        j1 = min(q_len, j0 + chunk)
        first = seq_len - q_len + j0  # position of the chunk's first query
        keys = first + (j1 - j0)  # causal: the chunk sees no key past its last query
        query_pos = torch.arange(first, first + j1 - j0, device=device)
        visible = key_pos[None, :keys] <= query_pos[:, None]  # [chunk, keys]
        # [chunk, Hq, D] -> [1, Hkv, group, chunk, D]: the heads of a group share one matmul.
        qc = q[q_start + j0:q_start + j1].to(k.dtype)
        qc = qc.view(j1 - j0, num_kv_heads, -1, head_dim).permute(1, 2, 0, 3).unsqueeze(0)
        o = _attend(qc, k[:, :, :keys], v[:, :, :keys], visible[None], scale)
        out[q_start + j0:q_start + j1] = o[0].permute(2, 0, 1, 3).reshape(
            j1 - j0, num_heads, head_dim).to(out.dtype)


def _slots(block_tables: torch.Tensor, seqs: torch.Tensor, seq_lens: torch.Tensor, width: int,
           block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache slots of positions 0..width-1 of each sequence `[S, width]`, and which are real.

    Positions past a sequence's length read its first slot instead: that one always holds a
    written, finite token, whereas a padding table entry or an unwritten slot may hold anything
    (NaN included), and 0 * NaN would leak through the masked-out softmax weights.
    """
    pos = torch.arange(width, device=seqs.device)
    pages = block_tables.index_select(0, seqs)[:, :-(-width // block_size)].long()
    slots = pages[:, pos // block_size] * block_size + pos % block_size
    visible = pos[None, :] < seq_lens[:, None]
    return torch.where(visible, slots, slots[:, :1]), visible


def _gather(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
            dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V at `slots [S, L]` as `[S, Hkv, L, D]`, heads outermost, so that each (sequence,
    KV head) is one contiguous matrix for the batched matmuls: one index_select each."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    heads = torch.arange(num_kv_heads, device=slots.device)
    rows = (slots[:, None, :] * num_kv_heads + heads[None, :, None]).flatten()
    shape = (slots.shape[0], num_kv_heads, slots.shape[1], head_dim)
    # Each layer's cache is contiguous (see reference.py), so this view addresses (slot, head).
    k = k_cache.view(-1, head_dim).index_select(0, rows).view(shape).to(dtype)
    v = v_cache.view(-1, head_dim).index_select(0, rows).view(shape).to(dtype)
    return k, v


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor,
            scale: float) -> torch.Tensor:
    """softmax(q k^T * scale, masked) v for q `[S, Hkv, G, Q, D]`, k/v `[S, Hkv, L, D]` and
    visible `[S, Q, L]`; returns `[S, Hkv, G, Q, D]`."""
    s, num_kv_heads, group, num_q, head_dim = q.shape
    keys = k.shape[2]
    q3 = q.reshape(s * num_kv_heads, group * num_q, head_dim)
    k3, v3 = k.reshape(s * num_kv_heads, keys, head_dim), v.reshape(s * num_kv_heads, keys, head_dim)
    scores = torch.bmm(q3, k3.transpose(1, 2)).mul_(scale)  # [S * Hkv, G * Q, L]
    scores.view(s, num_kv_heads, group, num_q, keys).masked_fill_(
        ~visible[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.bmm(probs, v3).view(s, num_kv_heads, group, num_q, head_dim)


def _compute_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32
