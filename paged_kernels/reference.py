"""Plain-torch references of every kernel: the engine's CPU path and the tests' ground truth.

Each function has exactly the signature of its Triton twin in `paged_attention.py` /
`cache_ops.py`, so the engine can swap one for the other (see `paged_kernels.get_kernel_ops`).
`paged_attention` here is a plain loop over the sequences, kept simple on purpose as the oracle;
the CPU backend attends with its vectorised twin in `torch_attention.py`.

KV cache layout (fixed, see ARCHITECTURE.md "Kernels"): one tensor
`kv_cache[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]`; per layer
`k_cache = kv_cache[layer, 0]`, `v_cache = kv_cache[layer, 1]`, each
`[num_blocks, block_size, num_kv_heads, head_dim]`. Token slot s lives in block
`s // block_size` at offset `s % block_size`.

This file imports torch only (no triton), so it works everywhere.
"""

from __future__ import annotations

import torch

__all__ = ["paged_attention", "write_kv", "copy_blocks", "swap_blocks", "gather_kv"]


def gather_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense K and V of one sequence, `[seq_len, num_kv_heads, head_dim]` each.

    Only the first `ceil(seq_len / block_size)` table entries are read: the rest is padding.
    """
    block_size = k_cache.shape[1]
    num_pages = -(-seq_len // block_size)
    pages = block_table[:num_pages].long()
    k = k_cache.index_select(0, pages).flatten(0, 1)[:seq_len]
    v = v_cache.index_select(0, pages).flatten(0, 1)[:seq_len]
    return k, v


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

    q: `[total_q_tokens, num_q_heads, head_dim]`, sequence after sequence. Sequence i owns the
    query rows `query_start_loc[i]:query_start_loc[i+1]` (its `q_len` new tokens) and a context
    of `seq_lens[i]` tokens (new tokens included: their K/V are already in the cache). Query j of
    sequence i sits at position `p = seq_len - q_len + j` and sees keys `0..p`; with a sliding
    `window` W (None or 0: none) only keys `p - W + 1..p`, W keys including its own (the rule of
    transformers' `sliding_window_overlay`: key > p - W). Table entries of blocks wholly left of
    the first query's window may be placeholders (the engine has dropped those blocks): their
    values get no weight, whatever they are.
    Returns `[total_q_tokens, num_q_heads, head_dim]` in q's dtype; math in float32 (float64 for
    float64 inputs). The hints `max_query_len`, `max_seq_len`, `num_splits` and `tile_map` only
    shape the Triton launch; they are accepted here so that both paths share one signature.
    """
    del max_query_len, max_seq_len, num_splits, tile_map  # the Triton launch's
    window = window or 0
    assert window >= 0, "window must be None, 0 (no window) or positive"
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    compute_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.empty_like(q)

    # One host read of the small metadata instead of one `.item()` per sequence.
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        q_start, q_end = qsl[i], qsl[i + 1]
        q_len = q_end - q_start
        k, v = gather_kv(k_cache, v_cache, block_tables[i], seq_len)
        # Keys left of the first query's window are dropped before any arithmetic: a placeholder
        # block may hold anything, and 0 * NaN would leak through a masked-out softmax weight.
        first_key = max(0, seq_len - q_len - window + 1) if window else 0
        k, v = k[first_key:], v[first_key:]
        # [q_len, Hq, D] -> [Hkv, group * q_len, D]: row g * q_len + j = (head g of the group,
        # token j), so one matmul per KV head serves every query head that shares it.
        qi = q[q_start:q_end].to(compute_dtype)
        qi = qi.view(q_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        qi = qi.reshape(num_kv_heads, group * q_len, head_dim)
        k = k.to(compute_dtype).transpose(0, 1)  # [Hkv, L, D]
        v = v.to(compute_dtype).transpose(0, 1)
        scores = torch.matmul(qi, k.transpose(1, 2)) * scale  # [Hkv, group * q_len, L]

        query_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        key_pos = torch.arange(first_key, seq_len, device=q.device)
        visible = key_pos[None, :] <= query_pos[:, None]
        if window:
            visible &= key_pos[None, :] > query_pos[:, None] - window
        visible = visible.repeat(group, 1)
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        oi = torch.matmul(probs, v)  # [Hkv, group * q_len, D]
        oi = oi.view(num_kv_heads, group, q_len, head_dim).permute(2, 0, 1, 3)
        out[q_start:q_end] = oi.reshape(q_len, num_q_heads, head_dim).to(q.dtype)
    return out


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store token t's K/V (`[num_tokens, num_kv_heads, head_dim]`) at slot `slot_mapping[t]`.

    A slot of -1 means "skip this token" (e.g. a padding token).
    """
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    # The caches are contiguous per layer, so a flat view addresses token slots directly.
    k_slots = k_cache.view(-1, k_cache.shape[2], k_cache.shape[3])
    v_slots = v_cache.view(-1, v_cache.shape[2], v_cache.shape[3])
    k_slots.index_copy_(0, slots, key[keep].to(k_cache.dtype))
    v_slots.index_copy_(0, slots, value[keep].to(v_cache.dtype))


def copy_blocks(
    kv_cache: torch.Tensor, src_block_ids: torch.Tensor, dst_block_ids: torch.Tensor
) -> None:
    """Copy-on-write: block `src[i]` -> block `dst[i]`, every layer, K and V.

    The gather happens before the scatter, so the result is as if all copies read the cache
    as it was before the call.
    """
    if src_block_ids.numel() == 0:
        return
    src = src_block_ids.to(kv_cache.device, torch.long)
    dst = dst_block_ids.to(kv_cache.device, torch.long)
    kv_cache.index_copy_(2, dst, kv_cache.index_select(2, src))


def swap_blocks(
    src_cache: torch.Tensor,
    dst_cache: torch.Tensor,
    src_block_ids: torch.Tensor,
    dst_block_ids: torch.Tensor,
) -> None:
    """Copy whole blocks (all layers, K and V) between two 6-d caches, maybe on two devices.

    Used for swap out (GPU -> pinned CPU) and swap in (pinned CPU -> GPU). The blocks are first
    gathered into one contiguous staging tensor on the source device, so that the cross-device
    transfer is a single large copy, then scattered into the destination. On the host side the
    staging buffer is pinned so that host<->device copies run at full DMA speed; the copy to
    the device is asynchronous (the destination's stream orders the later scatter), the copy to
    the host is not (the host scatter needs the data).
    """
    if src_block_ids.numel() == 0:
        return
    src_ids = src_block_ids.to(src_cache.device, torch.long)
    dst_ids = dst_block_ids.to(dst_cache.device, torch.long)
    if src_cache.device == dst_cache.device:
        dst_cache.index_copy_(2, dst_ids, src_cache.index_select(2, src_ids))
        return

    shape = list(src_cache.shape)
    shape[2] = src_ids.numel()
    if src_cache.device.type == "cpu":  # swap in: host -> device
        pin = torch.cuda.is_available() and src_cache.is_pinned()
        staging = torch.empty(shape, dtype=src_cache.dtype, pin_memory=pin)
        torch.index_select(src_cache, 2, src_ids, out=staging)
        moved = staging.to(dst_cache.device, non_blocking=pin)
    else:  # swap out: device -> host (or device -> another device)
        gathered = src_cache.index_select(2, src_ids)
        if dst_cache.device.type == "cpu" and torch.cuda.is_available():
            moved = torch.empty(shape, dtype=src_cache.dtype, pin_memory=True)
            moved.copy_(gathered)  # blocking: the host scatter below reads it
        else:
            moved = gathered.to(dst_cache.device)
    dst_cache.index_copy_(2, dst_ids, moved.to(dst_cache.dtype))
