"""Paged attention in vectorised plain torch: the CPU backend's attention at serving scale.

Owns `paged_attention`, with exactly the signature of `paged_kernels.reference.paged_attention` (the
loop that stays the tests' oracle) and of the Triton kernel. The loop pays about twenty small
torch calls per sequence per layer; with a few hundred decoding sequences those calls, not the
arithmetic, are the step. Here sequences are attended in groups instead:

- A group gathers every member's K and V through its block table with ONE `index_select` each,
  straight into `[seqs * kv_heads, max_len, head_dim]`, and attends with two batched matmuls, a
  mask and a float32 softmax. Grouped-query attention needs no `repeat`: the query heads that
  share a KV head are rows of one matmul (`[seqs * kv_heads, group * queries, head_dim]`).
- Decodes (one query) and prefills (several queries, maybe after a cached prefix: causal within
  the new tokens, full over the prefix) go through the same code; a prefill group pads its
  query rows to its longest member and drops the padding rows afterwards.
- A group of fewer than `MIN_BATCHED` items goes item by item, each over its exact context (no
  padding, no length mask): cheaper than building a batch's indices, so the single-sequence
  step of the playground is no slower than with the loop.

Memory and padding. Padding everything to the batch's longest context would turn one
8,000-token sequence among short ones into 8,000 gathered keys for everyone. So items are
grouped by geometric size classes (`_size_class`): decodes by octaves of context length,
prefills (kept apart from decodes) by quarter octaves of query count and of context length,
as their cost is quadratic. A member is padded to less than twice its size (or to a small
floor), and a serving step has a handful of groups. A group is split when its gather or its
score matrix would pass a fixed size, and a prefill too long for the score budget on its own
attends in query chunks (a chunk of queries is itself a valid work item: the same queries
over a context that ends at the chunk's last one).

Sliding window (`window` W, see the reference): query p sees keys p - W + 1..p only. Table
entries of blocks wholly left of an item's first query's window may be placeholders (dropped
blocks, given back to the pool: block 0 or another sequence's), so nothing there may get weight
or reach the arithmetic. An item on its own gathers only from the first block its first query
sees, so a long sliding-window context costs W keys, not the whole context. A batched group
still gathers its full width (its size classes and budgets are the context's), but positions
left of the window read an in-window slot instead, as padding does, and are masked out.

Math in float32 (float64 for float64 inputs), output in q's dtype, as the reference.
"""

from __future__ import annotations

import torch

__all__ = ["paged_attention"]

# Size classes of the grouping (see `_size_class`). A decode's cost is reading its keys, and a
# group costs ~20 torch calls, so decodes group by octaves of context length, all contexts up to
# 64 together. A prefill's cost is queries x keys multiply-adds, so padding costs twice over:
# prefills group by quarter octaves of both, from 16.
DECODE_FLOOR, DECODE_STEPS = 64, 1
PREFILL_FLOOR, PREFILL_STEPS = 16, 4
# Smaller groups go item by item: the batched path's index building (~50 small torch calls)
# costs more than a few direct items (~15 calls each, no padding, no mask for a decode).
MIN_BATCHED = 4
# Elements of K (and as many of V) that one group may gather: 64 MiB each in float32.
MAX_GATHER_ELEMENTS = 1 << 24
# Elements of one group's score matrix [seqs, heads, queries, keys]: 64 MiB in float32.
MAX_SCORE_ELEMENTS = 1 << 24

# A work item: (sequence index, first query row, query count, context length). The context
# includes the queries, whose K/V are already in the cache; query j sits at ctx - q_len + j.
Item = tuple[int, int, int, int]


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
    *,
    window: int | None = None,
    tile_map: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal, grouped-query attention of packed new tokens over their paged context.

    Same contract as `paged_kernels.reference.paged_attention` (see there), sliding `window` included
    (None or 0: none). The hints are ignored: the decode-graph path passes its capture-time
    maxima, not this batch's.
    """
    del max_query_len, max_seq_len, num_splits, tile_map  # the Triton launch's
    window = window or 0
    assert window >= 0, "window must be None, 0 (no window) or positive"
    out = torch.empty_like(q)
    lens = seq_lens.tolist()  # one host read of the small metadata per call
    starts = query_start_loc.tolist()
    items = _work_items(lens, starts, q.shape[1])
    for group in _groups(items, q.shape[1], k_cache.shape[2] * k_cache.shape[3]):
        if len(group) < MIN_BATCHED:
            for item in group:
                _attend_one(q, k_cache, v_cache, block_tables, item, scale, window, out)
        else:
            _attend_group(q, k_cache, v_cache, block_tables, group, scale, window, out)
    return out


def _work_items(lens: list[int], starts: list[int], num_heads: int) -> list[Item]:
    """One item per sequence with new tokens; a prefill whose scores alone would pass the
    budget becomes several items of consecutive queries."""
    items: list[Item] = []
    for i, ctx in enumerate(lens):
        first, q_len = starts[i], starts[i + 1] - starts[i]
        if q_len < 1:
            continue
        if num_heads * q_len * ctx <= MAX_SCORE_ELEMENTS:
            items.append((i, first, q_len, ctx))
            continue
        chunk = max(1, MAX_SCORE_ELEMENTS // (num_heads * ctx))
        for j0 in range(0, q_len, chunk):
            j1 = min(q_len, j0 + chunk)
            items.append((i, first + j0, j1 - j0, ctx - (q_len - j1)))
    return items


def _groups(items: list[Item], num_heads: int, per_token: int) -> list[list[Item]]:
    """Items of similar query count and context length, each group within both budgets."""
    buckets: dict[tuple, list[Item]] = {}
    for item in items:
        q_len, ctx = item[2], item[3]
        if q_len == 1:  # decodes never wait on prefills
            key: tuple = (0, _size_class(ctx, DECODE_FLOOR, DECODE_STEPS))
        else:
            key = (1, _size_class(q_len, PREFILL_FLOOR, PREFILL_STEPS),
                   _size_class(ctx, PREFILL_FLOOR, PREFILL_STEPS))
        buckets.setdefault(key, []).append(item)
    groups: list[list[Item]] = []
    for key in sorted(buckets):
        members = buckets[key]
        q_max = max(item[2] for item in members)
        width = max(item[3] for item in members)
        size = max(1, min(MAX_GATHER_ELEMENTS // (width * per_token),
                          MAX_SCORE_ELEMENTS // (num_heads * q_max * width)))
        groups += [members[j:j + size] for j in range(0, len(members), size)]
    return groups


def _size_class(n: int, floor: int, steps: int) -> tuple[int, int]:
    """Geometric size class: `steps` (a power of two) classes per octave, sizes up to `floor`
    in one class. Members of a class differ by less than a factor 1 + 1 / steps (or are small),
    which bounds the padding of a group."""
    m = max(n, floor) - 1
    octave = m.bit_length()
    return octave, m >> max(octave - steps.bit_length(), 0)


def _attend_group(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  block_tables: torch.Tensor, group: list[Item], scale: float, window: int,
                  out: torch.Tensor) -> None:
    """Attend one group's queries and write them into their rows of `out`."""
    num_seqs, num_heads, head_dim = len(group), q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    q_max = max(item[2] for item in group)
    width = max(item[3] for item in group)
    seq, first, q_len, ctx = torch.tensor(group, device=q.device).unbind(1)
    first_key = (ctx - q_len - window + 1).clamp_(min=0) if window else torch.zeros_like(ctx)
    slots, has_key = _slots(block_tables, seq, ctx, first_key, width, k_cache.shape[1])
    k, v = _gather(k_cache, v_cache, slots, _compute_dtype(q))
    rows, real, visible = _queries(first, q_len, ctx, has_key, q_max, window)
    qg = q.index_select(0, rows.flatten()).to(k.dtype)
    qg = qg.view(num_seqs, q_max, num_kv_heads, -1, head_dim).permute(0, 2, 3, 1, 4)
    o = _attend(qg, k, v, visible, scale)  # [S, Hkv, G, Q, D]
    o = o.permute(0, 3, 1, 2, 4).reshape(num_seqs * q_max, num_heads, head_dim)
    rows = rows.flatten()
    if sum(item[2] for item in group) < num_seqs * q_max:  # drop the padding query rows
        keep = real.flatten()
        o, rows = o[keep], rows[keep]
    out.index_copy_(0, rows, o.to(out.dtype))


def _attend_one(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                block_tables: torch.Tensor, item: Item, scale: float, window: int,
                out: torch.Tensor) -> None:
    """One item on its own: its exact context, so no padding and no length mask; with a
    window, only the pages from the first one its first query sees (none is a placeholder)."""
    i, first, q_len, ctx = item
    block_size, num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    dtype = _compute_dtype(q)
    first_page = max(0, ctx - q_len - window + 1) // block_size if window else 0
    n = ctx - first_page * block_size  # keys gathered; key t sits at position ctx - n + t
    pages = block_tables[i, first_page:-(-ctx // block_size)].long()
    k = k_cache.index_select(0, pages).view(-1, num_kv_heads, head_dim)[:n].to(dtype)
    v = v_cache.index_select(0, pages).view(-1, num_kv_heads, head_dim)[:n].to(dtype)
    # [q_len, Hq, D] -> [Hkv, G * q_len, D]: the heads of a group share one matmul.
    qi = q[first:first + q_len].to(dtype).view(q_len, num_kv_heads, -1, head_dim)
    qi = qi.permute(1, 2, 0, 3).reshape(num_kv_heads, -1, head_dim)
    scores = torch.bmm(qi, k.permute(1, 2, 0)).mul_(scale)  # [Hkv, G * q_len, n]
    hidden = _hidden(q_len, n, window, q.device)
    if hidden is not None:
        scores.view(num_kv_heads, -1, q_len, n).masked_fill_(hidden, float("-inf"))
    o = torch.bmm(torch.softmax(scores, dim=-1), v.transpose(0, 1))  # [Hkv, G * q_len, D]
    o = o.view(num_kv_heads, -1, q_len, head_dim).permute(2, 0, 1, 3)
    out[first:first + q_len] = o.reshape(q_len, -1, head_dim).to(out.dtype)


def _hidden(q_len: int, n: int, window: int, device: torch.device) -> torch.Tensor | None:
    """The `[q_len, n]` mask of keys hidden from each query of an item whose n keys end at
    its last query (query j at key index n - q_len + j), or None when every key is visible."""
    hidden = None
    if q_len > 1:  # causal: query j sees no later key
        hidden = torch.ones(q_len, n, dtype=torch.bool, device=device).triu_(n - q_len + 1)
    if window and n > window:  # key t > n - q_len + j - window, or it is hidden from query j
        early = torch.ones(q_len, n, dtype=torch.bool, device=device).tril_(n - q_len - window)
        hidden = early if hidden is None else hidden | early
    return hidden


def _slots(block_tables: torch.Tensor, seqs: torch.Tensor, ctx: torch.Tensor,
           first_key: torch.Tensor, width: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache slots of positions 0..width-1 of each sequence `[S, width]`, and which are real:
    positions first_key..ctx-1 (first_key: the first key the item's first query sees).

    Other positions read the slot of first_key instead: that one always holds a written, finite
    token, whereas a padding table entry, an unwritten slot or a placeholder entry left of the
    window may hold anything (NaN included), and 0 * NaN would leak through the masked-out
    softmax weights. The placeholder entries themselves are read as integers only.
    """
    pos = torch.arange(width, device=seqs.device)
    pages = block_tables.index_select(0, seqs)[:, :-(-width // block_size)].long()
    slots = pages[:, pos // block_size] * block_size + pos % block_size
    has_key = (pos[None, :] < ctx[:, None]) & (pos[None, :] >= first_key[:, None])
    return torch.where(has_key, slots, slots.gather(1, first_key[:, None])), has_key


def _queries(first: torch.Tensor, q_len: torch.Tensor, ctx: torch.Tensor, has_key: torch.Tensor,
             q_max: int, window: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query rows `[S, Q]` (padding rows repeat the first), which are real, and the mask
    `[S, Q, L]`: query j sees keys 0..ctx - q_len + j, with a window only those past
    ctx - q_len + j - window. A padding row sees what the last query sees, so its softmax stays
    finite; it is dropped afterwards."""
    j = torch.arange(q_max, device=first.device)
    real = j[None, :] < q_len[:, None]
    rows = torch.where(real, first[:, None] + j, first[:, None])
    query_pos = (ctx - q_len)[:, None] + torch.minimum(j[None, :], q_len[:, None] - 1)  # [S, Q]
    key_pos = torch.arange(has_key.shape[1], device=first.device)[None, None, :]
    visible = (key_pos <= query_pos[:, :, None]) & has_key[:, None, :]
    if window:
        visible &= key_pos > query_pos[:, :, None] - window
    return rows, real, visible


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
