"""Triton paged attention: one unified kernel for prefill chunks and decodes, plus split-K.

Owns `paged_attention` (same signature as `paged_kernels.reference.paged_attention`) and its two Triton
kernels (`_paged_attn_kernel`, `_merge_splits_kernel`); the launch heuristics (tile sizes, split
count) live in `paged_kernels.attention_config` and are imported back here.

How the unified kernel works (read with ARCHITECTURE.md "Kernels"):

* One program = one (sequence, KV head, tile of query tokens[, split of the context]).
* Grouped-query attention: the `group = num_q_heads // num_kv_heads` query heads that share a KV
  head are processed by the same program. The M dimension of `tl.dot` holds
  `BLOCK_Q tokens x group heads` (row r = token r // group, head r % group), padded to a power of
  two >= 16, so every K/V tile is loaded ONCE for the whole group.
* K/V tiles of `BLOCK_N` tokens are gathered through the block table: key position n lives in
  physical block `block_table[n // block_size]` at offset `n % block_size`. A tile may span
  several pages (block_size 1 works) or part of one (block_size 128).
* Online softmax (flash-attention style) in float32, in base 2: scores are scaled by
  `scale * log2(e)` so `exp2` replaces `exp`.
* Causality: query j of a sequence sits at position `seq_len - q_len + j`. Keys left of the
  tile's first query position are visible to every row of the tile: those tiles run without any
  mask (the common case for decode and for long cached prefixes); only the tail is masked.
* Sliding window (`window` W; the kernel's `SLIDING` constexpr, so the no-window kernel is the
  plain one): row p sees keys p - W + 1..p. The key loop starts at the tile holding the lowest
  key any row of the query tile sees (the first row's p - W + 1), so tiles left of the window
  are never loaded: reads and work are bounded by W, and the table entries there, which may be
  placeholders of blocks the engine has dropped, are never dereferenced (masked loads keep it so
  inside the first tile too). Tiles holding keys some row must not see (the window's left edge)
  get the mask `key > p - W` with the causal one; tiles inside every row's window and before
  the causal tail stay on the unmasked fast path.
* Split-K (for few, long decodes): the context of each program is cut into `NUM_SPLITS` slices
  handled by separate programs, which write a partial output and its log-sum-exp; a second small
  kernel merges them. Without it, a batch of 4 sequences x 3 KV heads would occupy 12 SMs out of
  132 on an H100 and leave most of the memory bandwidth idle. With a window the slices divide
  only the in-window keys; a slice where a row sees nothing gives it log-sum-exp -inf (weight 0).

The kernels use only long-standing Triton APIs (tl.load/store with masks, tl.dot, range loops),
so they compile with Triton 3.x and run on CPU under `TRITON_INTERPRET=1`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .attention_config import AttnConfig, choose_num_splits, select_config

__all__ = ["paged_attention", "AttnConfig", "select_config", "choose_num_splits", "CONFIG_OVERRIDE"]

LOG2E = math.log2(math.e)  # scores are scaled by this so exp2 can replace exp

# Benchmarks may set this to a dict with any of block_n / num_warps / num_stages (decode only)
# to sweep configurations without editing the heuristic; every launch hands it to select_config.
CONFIG_OVERRIDE: dict | None = None


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """tl.dot; IEEE=True asks for exact fp32 products (fp32 inputs default to TF32 on GPUs)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _attend_tile(
    acc, m_i, l_i, q,
    k_cache_ptr, v_cache_ptr, table_row_ptr,
    start, kv_end, query_pos, key_lo, window,
    kv_head, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    qk_scale,
    offs_n, offs_d,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr, SLIDING: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):
    """One online-softmax step over keys `start .. start + BLOCK_N` (positions in the sequence).

    MASKED=False is the fast path: the whole tile is in range and visible to every row. With
    SLIDING, a masked tile reads no key below `key_lo` (the lowest key any row sees: below it a
    table entry may be a dropped block's placeholder) and row p sees only keys > p - window.
    """
    key_pos = start + offs_n
    # Gather: key position -> (physical block from the table, offset inside the block).
    if MASKED:
        in_range = key_pos < kv_end
        if SLIDING:
            in_range = in_range & (key_pos >= key_lo)
        block_ids = tl.load(table_row_ptr + key_pos // BLOCK_SIZE, mask=in_range, other=0)
    else:
        block_ids = tl.load(table_row_ptr + key_pos // BLOCK_SIZE)
    block_ids = block_ids.to(tl.int64)  # block * stride can exceed 2**31 in a large pool
    offsets = key_pos % BLOCK_SIZE
    k_ptrs = (k_cache_ptr + block_ids[:, None] * stride_kb + offsets[:, None] * stride_ks
              + kv_head * stride_kh + offs_d[None, :])
    v_ptrs = (v_cache_ptr + block_ids[:, None] * stride_vb + offsets[:, None] * stride_vs
              + kv_head * stride_vh + offs_d[None, :])
    if MASKED:
        kv_mask = in_range[:, None] & (offs_d[None, :] < HEAD_DIM)
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
    elif BLOCK_D != HEAD_DIM:
        k = tl.load(k_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        v = tl.load(v_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)

    s = _dot(q, tl.trans(k), IEEE) * qk_scale  # [BLOCK_M, BLOCK_N]
    if MASKED:
        visible = (key_pos[None, :] <= query_pos[:, None]) & in_range[None, :]
        if SLIDING:
            visible = visible & (key_pos[None, :] > query_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))

    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
    return acc, m_new, l_i


@triton.jit
def _paged_attn_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    part_out_ptr, part_lse_ptr, tile_map_ptr,
    qk_scale, window,
    stride_qt, stride_qh,
    stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt,
    stride_ps, stride_pt, stride_ph,  # partial out [split, token, head, d]; lse shares the first 3
    stride_ls, stride_lt,
    stride_map,  # the tile map's two rows: sequences, then their query tiles
    GROUP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SLIDING: tl.constexpr,  # window > 0; False compiles the plain causal kernel
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
    TILE_MAP: tl.constexpr,  # program (i, head): the map's i-th (sequence, query tile)
):
    kv_head = tl.program_id(1)
    if TILE_MAP:  # a graph's grid, fixed at capture: the step's tiles are listed, -1 pads
        seq = tl.load(tile_map_ptr + tl.program_id(0))
        q_tile = tl.load(tile_map_ptr + stride_map + tl.program_id(0))
        live = seq >= 0
        seq = tl.maximum(seq, 0)
        split = 0
    else:
        seq = tl.program_id(0)
        q_tile = tl.program_id(2) // NUM_SPLITS
        split = tl.program_id(2) % NUM_SPLITS
    BLOCK_Q = BLOCK_M // GROUP  # query tokens per tile (a constexpr)

    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if TILE_MAP:
        q_len = tl.where(live, q_len, 0)  # a padding entry: no query, nothing to do
    seq_len = tl.load(seq_lens_ptr + seq)
    first_tok = q_tile * BLOCK_Q
    if first_tok < q_len:  # the grid is sized for the longest query; shorter ones skip tiles
        context_len = seq_len - q_len  # cached tokens before the new ones

        offs_m = tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        tok = first_tok + offs_m // GROUP
        head = kv_head * GROUP + offs_m % GROUP
        row_valid = (offs_m < BLOCK_Q * GROUP) & (tok < q_len)
        query_pos = context_len + tok

        q_rows = (q_start + tok).to(tl.int64)
        q_ptrs = q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
        q = tl.load(q_ptrs, mask=row_valid[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
        if UPCAST:
            q = q.to(tl.float32)

        # Keys this tile needs: [key_lo, kv_end), from tile win_lo on. Keys < no_mask_end are
        # not after any row (causality needs no mask there).
        last_tok = tl.minimum(first_tok + BLOCK_Q, q_len)
        kv_end = context_len + last_tok
        no_mask_end = ((context_len + first_tok + 1) // BLOCK_N) * BLOCK_N
        key_lo = 0
        win_lo = 0
        if SLIDING:  # the first row's window starts lowest; tiles left of it are never loaded
            key_lo = tl.maximum(context_len + first_tok - window + 1, 0)
            win_lo = (key_lo // BLOCK_N) * BLOCK_N
        # This program's slice of the keys (the whole range when NUM_SPLITS == 1); slices are
        # whole tiles so that only the last tile of the sequence is ever partial.
        chunk = tl.cdiv(tl.cdiv(kv_end - win_lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
        lo = win_lo + split * chunk
        hi = tl.minimum(kv_end, lo + chunk)

        table_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt
        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # finite: no inf - inf = NaN
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        fast_lo = lo
        if SLIDING:
            # Keys >= kv_end - window are in every row's window (the last row's starts there):
            # the tiles before the first such tile boundary are the window's masked left edge.
            edge_end = tl.cdiv(tl.maximum(kv_end - window, 0), BLOCK_N) * BLOCK_N
            fast_lo = tl.maximum(lo, edge_end)
            for start in range(lo, tl.minimum(hi, fast_lo), BLOCK_N):
                acc, m_i, l_i = _attend_tile(
                    acc, m_i, l_i, q, k_cache_ptr, v_cache_ptr, table_row_ptr,
                    start, kv_end, query_pos, key_lo, window, kv_head,
                    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                    qk_scale, offs_n, offs_d,
                    BLOCK_SIZE, HEAD_DIM, BLOCK_D, True, SLIDING, IEEE, UPCAST,
                )
        for start in range(fast_lo, tl.minimum(hi, no_mask_end), BLOCK_N):
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, q, k_cache_ptr, v_cache_ptr, table_row_ptr,
                start, kv_end, query_pos, key_lo, window, kv_head,
                stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                qk_scale, offs_n, offs_d,
                BLOCK_SIZE, HEAD_DIM, BLOCK_D, False, SLIDING, IEEE, UPCAST,
            )
        for start in range(tl.maximum(fast_lo, no_mask_end), hi, BLOCK_N):
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, q, k_cache_ptr, v_cache_ptr, table_row_ptr,
                start, kv_end, query_pos, key_lo, window, kv_head,
                stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                qk_scale, offs_n, offs_d,
                BLOCK_SIZE, HEAD_DIM, BLOCK_D, True, SLIDING, IEEE, UPCAST,
            )

        # A row that saw no key in this split (possible only with NUM_SPLITS > 1: an empty
        # split, or with a window one wholly left of the row's window) has l = 0.
        has_keys = l_i > 0.0
        out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
        d_mask = offs_d[None, :] < HEAD_DIM
        if NUM_SPLITS == 1:
            o_ptrs = out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
            tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & d_mask)
        else:
            p_ptrs = (part_out_ptr + split * stride_ps + q_rows[:, None] * stride_pt
                      + head[:, None] * stride_ph + offs_d[None, :])
            tl.store(p_ptrs, out, mask=row_valid[:, None] & d_mask)
            lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
            tl.store(part_lse_ptr + split * stride_ls + q_rows * stride_lt + head, lse,
                     mask=row_valid)


@triton.jit
def _merge_splits_kernel(
    part_out_ptr, part_lse_ptr, out_ptr,
    stride_ps, stride_pt, stride_ph,
    stride_ls, stride_lt,
    stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr,
):
    """out = sum_s w_s * out_s / sum_s w_s with w_s = 2**lse_s (log-sum-exp in base 2).

    A split where the row saw no key has lse = -inf: weight 0. Without a window split 0 holds
    key 0, visible to every row; with one, only the split of the row's own key is sure to be
    finite, so a row with every lse = -inf (none in practice) is guarded to 0, not NaN.
    """
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_P2)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < NUM_SPLITS
    lse = tl.load(part_lse_ptr + offs_s * stride_ls + tok * stride_lt + head, mask=s_mask,
                  other=float("-inf"))
    lse_max = tl.max(lse, axis=0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)  # no -inf - -inf = NaN
    w = tl.exp2(lse - lse_max)
    parts = tl.load(
        part_out_ptr + offs_s[:, None] * stride_ps + tok * stride_pt + head * stride_ph
        + offs_d[None, :],
        mask=s_mask[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0,
    )
    w_sum = tl.sum(w, axis=0)
    out = tl.sum(parts * w[:, None], axis=0) / tl.where(w_sum > 0.0, w_sum, 1.0)
    tl.store(out_ptr + tok * stride_ot + head * stride_oh + offs_d,
             out.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


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
    """Triton paged attention; semantics and arguments as `paged_kernels.reference.paged_attention`,
    sliding `window` included (None or 0: none).

    `tile_map` (int32 [2, M]: sequence indices, then query tile indices, -1 sequences pad) lists
    the (sequence, query tile) pairs to run, one program each, for a grid that cannot follow the
    step: a CUDA graph's (engine/runtime/prefill_graphs.py). Its tiles are `query_tile(...)`
    tokens for this `max_query_len`; it implies no split.

    `max_query_len` / `max_seq_len` size the grid; when omitted they are read from the device
    (one synchronisation each). `num_splits` forces the split-K path's split count (1 = off);
    None picks it by heuristic on a GPU (`choose_num_splits`) where every query fits one tile:
    decodes, and short chunks over long contexts (a prompt's last tokens after its prefix came
    back from the CPU tier). Longer prefills have tiles enough to fill the GPU; splitting them
    would only add kernel variants (a hybrid 4,096-token run compiled them mid-run: its
    prefill steps took 0.95 s against 0.46).
    """
    window = int(window or 0)
    assert window >= 0, "window must be None, 0 (no window) or positive"
    total_q, num_q_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs = seq_lens.shape[0]
    assert num_q_heads % num_kv_heads == 0, "num_q_heads must be a multiple of num_kv_heads"
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1 and q.stride(-1) == 1
    assert block_tables.dtype == torch.int32 and block_tables.stride(-1) == 1
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(q)
    if total_q == 0 or num_seqs == 0:
        return out

    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    cfg = select_config(max_query_len, group, head_dim, block_size, CONFIG_OVERRIDE)
    block_q = cfg.block_m // group
    num_q_tiles = triton.cdiv(max_query_len, block_q)

    if tile_map is not None:
        num_splits = 1
    elif num_splits is None:
        if q.device.type == "cuda" and num_q_tiles == 1:
            if max_seq_len is None:
                max_seq_len = int(seq_lens.max())
            num_splits = choose_num_splits(num_seqs, num_kv_heads, max_seq_len, cfg.block_n,
                                           q.device, window)
            if max_query_len > 1:  # a power of two: each count is a kernel to compile mid-run
                num_splits = 1 << (num_splits.bit_length() - 1)
        else:
            num_splits = 1
    num_splits = max(1, int(num_splits))

    if num_splits > 1:
        part_out = torch.empty((num_splits, total_q, num_q_heads, head_dim),
                               dtype=torch.float32, device=q.device)
        part_lse = torch.empty((num_splits, total_q, num_q_heads),
                               dtype=torch.float32, device=q.device)
    else:  # unused by the kernel; any tensor of the right rank keeps the signature uniform
        part_out = out.unsqueeze(0)
        part_lse = out[..., 0].unsqueeze(0)

    block_d = triton.next_power_of_2(head_dim)
    # The CPU interpreter (tests) computes tl.dot of bf16/fp16 wrongly (it sees the raw 16-bit
    # integers): there, and for fp32 inputs, dots run in exact fp32 instead of TF32.
    upcast = q.device.type == "cpu"
    ieee = upcast or q.dtype == torch.float32
    grid = (num_seqs, num_kv_heads, num_q_tiles * num_splits)
    if tile_map is not None:
        assert tile_map.dtype == torch.int32 and tile_map.shape[0] == 2 and tile_map.stride(1) == 1
        grid = (tile_map.shape[1], num_kv_heads, 1)
    _paged_attn_kernel[grid](
        q, k_cache, v_cache, out,
        block_tables, seq_lens, query_start_loc,
        part_out, part_lse, seq_lens if tile_map is None else tile_map,
        scale * LOG2E, window,
        q.stride(0), q.stride(1),
        out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        0 if tile_map is None else tile_map.stride(0),
        GROUP=group, BLOCK_SIZE=block_size, HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, NUM_SPLITS=num_splits,
        SLIDING=window > 0, IEEE=ieee, UPCAST=upcast, TILE_MAP=tile_map is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if num_splits > 1:
        _merge_splits_kernel[(total_q, num_q_heads)](
            part_out, part_lse, out,
            part_out.stride(0), part_out.stride(1), part_out.stride(2),
            part_lse.stride(0), part_lse.stride(1),
            out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_D=block_d, NUM_SPLITS=num_splits,
            SPLITS_P2=triton.next_power_of_2(num_splits),
            num_warps=1 if head_dim <= 64 else 2,
        )
    return out

