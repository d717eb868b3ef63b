"""Triton cache operations: write new K/V into their slots, copy-on-write block copies, swaps.

Owns `write_kv` and `copy_blocks` (same signatures as in `paged_kernels.reference`). `swap_blocks`
moves blocks between the device pool and the pinned host pool with the same copy kernel: pinned
host memory is addressable from the GPU, so one launch moves scattered blocks across PCIe.

Layout: `kv_cache[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]`, slot
s = block * block_size + offset (see ARCHITECTURE.md "Kernels").
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from . import interpreter_enabled, reference

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
    src_cache_ptr, dst_cache_ptr, src_ptr, dst_ptr,
    src_stride_plane, src_stride_block, dst_stride_plane, dst_stride_block,
    BLOCK_NUMEL: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Program (pair, plane, chunk) copies CHUNK elements of block src[pair] -> dst[pair] in one
    (layer, K|V) plane. A block is contiguous inside a plane: block_size * heads * head_dim.
    Source and destination may be two caches, one of them in pinned host memory (a swap)."""
    pair = tl.program_id(0)
    plane = tl.program_id(1).to(tl.int64)
    chunk = tl.program_id(2)
    src = tl.load(src_ptr + pair).to(tl.int64)
    dst = tl.load(dst_ptr + pair).to(tl.int64)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < BLOCK_NUMEL
    data = tl.load(src_cache_ptr + plane * src_stride_plane + src * src_stride_block + offs,
                   mask=mask)
    tl.store(dst_cache_ptr + plane * dst_stride_plane + dst * dst_stride_block + offs, data,
             mask=mask)


def _launch_block_copy(src_cache: torch.Tensor, dst_cache: torch.Tensor,
                       src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None:
    assert src_cache.dim() == 6 and src_cache.is_contiguous() and dst_cache.is_contiguous()
    assert src_cache.shape[:2] == dst_cache.shape[:2] and src_cache.shape[3:] == dst_cache.shape[3:]
    num_layers, two, _, block_size, num_heads, head_dim = src_cache.shape
    block_numel = block_size * num_heads * head_dim
    chunk = min(triton.next_power_of_2(block_numel), 4096)
    grid = (src_ids.numel(), num_layers * two, triton.cdiv(block_numel, chunk))
    # [L, 2, ...] contiguous: plane l * 2 + kv starts at (l * 2 + kv) * stride(1).
    _copy_blocks_kernel[grid](
        src_cache, dst_cache, src_ids, dst_ids,
        src_cache.stride(1), src_cache.stride(2), dst_cache.stride(1), dst_cache.stride(2),
        BLOCK_NUMEL=block_numel, CHUNK=chunk,
        num_warps=4,
    )


def copy_blocks(
    kv_cache: torch.Tensor, src_block_ids: torch.Tensor, dst_block_ids: torch.Tensor
) -> None:
    """Copy-on-write: block `src[i]` -> block `dst[i]` in every layer, K and V, in ONE launch.

    Precondition (true for copy-on-write, whose destinations are freshly allocated): no block
    is both a source and a destination in the same call, since programs run in any order.
    """
    if src_block_ids.numel() == 0:
        return
    assert src_block_ids.device == kv_cache.device and dst_block_ids.device == kv_cache.device
    _launch_block_copy(kv_cache, kv_cache, src_block_ids, dst_block_ids)


def swap_blocks(
    src_cache: torch.Tensor,
    dst_cache: torch.Tensor,
    src_block_ids: torch.Tensor,
    dst_block_ids: torch.Tensor,
) -> None:
    """Swap out (device -> pinned host) or in (pinned host -> device) in ONE kernel launch.

    Pinned host memory is mapped into the GPU's address space, so the kernel's loads and stores
    cross PCIe directly: no staging buffer, no host-side gather or scatter, scattered blocks on
    both sides. Asynchronous like any launch: synchronise before the host reads a swapped-out
    block. Anything else (unpinned host memory, two CPU caches) takes the reference path.
    """
    if src_block_ids.numel() == 0:
        return
    cuda = [c.device for c in (src_cache, dst_cache) if c.device.type == "cuda"]
    if cuda:  # the host side must be pinned to be reachable from the kernel
        direct = all(c.device.type == "cuda" or c.is_pinned() for c in (src_cache, dst_cache))
    else:  # two host caches: only the interpreter (tests) runs the kernel on the CPU
        direct = interpreter_enabled()
    if not direct:
        reference.swap_blocks(src_cache, dst_cache, src_block_ids, dst_block_ids)
        return
    device = cuda[0] if cuda else src_cache.device
    src_ids = src_block_ids.to(device, torch.int64, non_blocking=True)
    dst_ids = dst_block_ids.to(device, torch.int64, non_blocking=True)
    with torch.cuda.device(device) if cuda else contextlib.nullcontext():
        _launch_block_copy(src_cache, dst_cache, src_ids, dst_ids)
