"""Triton cache operations: write new K/V into their slots, and copy-on-write block copies.

Owns `write_kv` and `copy_blocks` (same signatures as in `kernels.reference`). `swap_blocks`
moves blocks between devices, which is a DMA transfer rather than a kernel: it is the plain
torch version from `kernels.reference`, re-exported here so that this module offers every
cache operation.

Layout: `kv_cache[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]`, slot
s = block * block_size + offset (see DESIGN.md "Kernels").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .reference import swap_blocks

__all__ = ["write_kv", "copy_blocks", "swap_blocks"]


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcs, stride_kch,
    stride_vcb, stride_vcs, stride_vch,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program per token: its K and V rows for every KV head."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    if slot >= 0:  # -1 marks a token that is not cached (padding)
        block = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        mask = (offs_h[:, None] < NUM_HEADS) & (offs_d[None, :] < HEAD_DIM)
        k = tl.load(key_ptr + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :],
                    mask=mask)
        v = tl.load(value_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :],
                    mask=mask)
        k_dst = (k_cache_ptr + block * stride_kcb + offset * stride_kcs
                 + offs_h[:, None] * stride_kch + offs_d[None, :])
        v_dst = (v_cache_ptr + block * stride_vcb + offset * stride_vcs
                 + offs_h[:, None] * stride_vch + offs_d[None, :])
        tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store token t's K/V (`[num_tokens, num_kv_heads, head_dim]`) at slot `slot_mapping[t]`;
    slot -1 skips the token. Key/value may be strided views (e.g. slices of a fused QKV)."""
    num_tokens, num_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    assert key.stride(-1) == 1 and value.stride(-1) == 1
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    _write_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, BLOCK_SIZE=k_cache.shape[1],
        BLOCK_H=triton.next_power_of_2(num_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=1 if num_heads * head_dim <= 512 else 4,
    )


@triton.jit
def _copy_blocks_kernel(
    cache_ptr, src_ptr, dst_ptr,
    stride_plane, stride_block,
    BLOCK_NUMEL: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Program (pair, plane, chunk) copies CHUNK elements of block src[pair] -> dst[pair] in one
    (layer, K|V) plane. A block is contiguous inside a plane: block_size * heads * head_dim."""
    pair = tl.program_id(0)
    plane = tl.program_id(1).to(tl.int64)
    chunk = tl.program_id(2)
    src = tl.load(src_ptr + pair)
    dst = tl.load(dst_ptr + pair)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < BLOCK_NUMEL
    base = cache_ptr + plane * stride_plane
    data = tl.load(base + src * stride_block + offs, mask=mask)
    tl.store(base + dst * stride_block + offs, data, mask=mask)


def copy_blocks(
    kv_cache: torch.Tensor, src_block_ids: torch.Tensor, dst_block_ids: torch.Tensor
) -> None:
    """Copy-on-write: block `src[i]` -> block `dst[i]` in every layer, K and V, in ONE launch.

    Precondition (true for copy-on-write, whose destinations are freshly allocated): no block
    is both a source and a destination in the same call, since programs run in any order.
    """
    num_pairs = src_block_ids.numel()
    if num_pairs == 0:
        return
    assert kv_cache.dim() == 6 and kv_cache.is_contiguous()
    assert src_block_ids.device == kv_cache.device and dst_block_ids.device == kv_cache.device
    num_layers, two, _, block_size, num_heads, head_dim = kv_cache.shape
    block_numel = block_size * num_heads * head_dim
    chunk = min(triton.next_power_of_2(block_numel), 4096)
    grid = (num_pairs, num_layers * two, triton.cdiv(block_numel, chunk))
    # [L, 2, ...] contiguous: plane l * 2 + kv starts at (l * 2 + kv) * stride(1).
    _copy_blocks_kernel[grid](
        kv_cache, src_block_ids, dst_block_ids,
        kv_cache.stride(1), kv_cache.stride(2),
        BLOCK_NUMEL=block_numel, CHUNK=chunk,
        num_warps=4,
    )
