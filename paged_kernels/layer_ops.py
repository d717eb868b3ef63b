"""Triton kernels for the lean decoder's layer: the elementwise work between the matmuls, fused.

A decoder layer run from Hugging Face modules launches about forty kernels, most of them tiny
elementwise ops (RMSNorm alone is six). In a decode step of a small model those launches, not
bytes, set the time. Fused here, with the same signatures and rounding as `layer_reference.py`:

* `add_rms_norm`: residual add + RMSNorm, one program per token;
* `rope_write_kv`: RoPE on q and k from the fused QKV projection, then k and v written into
  their cache slots, one program per token (replaces split, rotate, transpose and `write_kv`);
* `silu_and_mul`: the MLP's SiLU(gate) * up, one program per token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["add_rms_norm", "rope_write_kv", "silu_and_mul"]


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, eps, N: tl.constexpr,
                         BLOCK: tl.constexpr, HAS_RES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=mask, other=0.0)
    if HAS_RES:
        x = (x.to(tl.float32) + tl.load(res_ptr + row * N + offs, mask=mask, other=0.0)
             .to(tl.float32)).to(x.dtype)
        tl.store(res_out_ptr + row * N + offs, x, mask=mask)
    h = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / N + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    out = (w.to(tl.float32) * (h * rstd).to(x.dtype).to(tl.float32)).to(x.dtype)
    tl.store(out_ptr + row * N + offs, out, mask=mask)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    t, n = x.shape
    assert x.is_contiguous() and (residual is None or residual.is_contiguous())
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else x
    block = triton.next_power_of_2(n)
    _add_rms_norm_kernel[(t,)](x, residual if residual is not None else x, weight, out, res_out,
                               eps, N=n, BLOCK=block, HAS_RES=residual is not None,
                               num_warps=4 if block >= 1024 else 2)
    return out, res_out


@triton.jit
def _rope_write_kv_kernel(qkv_ptr, cos_sin_ptr, pos_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                          q_out_ptr, stride_qkv, stride_cs,
                          stride_kcb, stride_kcs, stride_kch,
                          stride_vcb, stride_vcs, stride_vch,
                          HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                          BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    offs_d = tl.arange(0, D)
    # rotate_half: [-x2, x1]; element d pairs with (d + D/2) mod D
    offs_rot = (offs_d + D // 2) % D
    sign = tl.where(offs_d < D // 2, -1.0, 1.0)
    cos = tl.load(cos_sin_ptr + pos * stride_cs + offs_d).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + D + offs_d).to(tl.float32)
    offs_h = tl.arange(0, BLOCK_H)
    row = qkv_ptr + tok * stride_qkv
    dtype = qkv_ptr.dtype.element_ty

    # q: heads 0 .. HQ-1
    qmask = offs_h[:, None] < HQ
    q = tl.load(row + offs_h[:, None] * D + offs_d[None, :], mask=qmask, other=0.0)
    q_rot = tl.load(row + offs_h[:, None] * D + offs_rot[None, :], mask=qmask, other=0.0)
    q_out = ((q.to(tl.float32) * cos[None, :]).to(dtype).to(tl.float32)
             + ((q_rot.to(tl.float32) * sign[None, :]).to(dtype).to(tl.float32)
                * sin[None, :]).to(dtype).to(tl.float32)).to(dtype)
    tl.store(q_out_ptr + tok * HQ * D + offs_h[:, None] * D + offs_d[None, :], q_out, mask=qmask)

    slot = tl.load(slot_ptr + tok)
    if slot >= 0:
        block = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE
        kmask = offs_h[:, None] < HKV
        k_row = row + HQ * D
        k = tl.load(k_row + offs_h[:, None] * D + offs_d[None, :], mask=kmask, other=0.0)
        k_rot = tl.load(k_row + offs_h[:, None] * D + offs_rot[None, :], mask=kmask, other=0.0)
        k_out = ((k.to(tl.float32) * cos[None, :]).to(dtype).to(tl.float32)
                 + ((k_rot.to(tl.float32) * sign[None, :]).to(dtype).to(tl.float32)
                    * sin[None, :]).to(dtype).to(tl.float32)).to(dtype)
        v = tl.load(k_row + HKV * D + offs_h[:, None] * D + offs_d[None, :], mask=kmask, other=0.0)
        k_dst = (k_cache_ptr + block * stride_kcb + offset * stride_kcs
                 + offs_h[:, None] * stride_kch + offs_d[None, :])
        v_dst = (v_cache_ptr + block * stride_vcb + offset * stride_vcs
                 + offs_h[:, None] * stride_vch + offs_d[None, :])
        tl.store(k_dst, k_out.to(k_cache_ptr.dtype.element_ty), mask=kmask)
        tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=kmask)


def rope_write_kv(qkv: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                  num_q_heads: int, num_kv_heads: int) -> torch.Tensor:
    t = qkv.shape[0]
    d = k_cache.shape[-1]
    assert qkv.stride(-1) == 1 and cos_sin.is_contiguous() and d == triton.next_power_of_2(d)
    q_out = torch.empty((t, num_q_heads, d), dtype=qkv.dtype, device=qkv.device)
    if t == 0:
        return q_out
    _rope_write_kv_kernel[(t,)](
        qkv, cos_sin, positions, k_cache, v_cache, slot_mapping, q_out,
        qkv.stride(0), cos_sin.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HQ=num_q_heads, HKV=num_kv_heads, D=d, BLOCK_SIZE=k_cache.shape[1],
        BLOCK_H=triton.next_power_of_2(max(num_q_heads, num_kv_heads)),
        num_warps=2,
    )
    return q_out


@triton.jit
def _silu_and_mul_kernel(gu_ptr, out_ptr, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    g = tl.load(gu_ptr + row * 2 * N + offs, mask=mask, other=0.0)
    u = tl.load(gu_ptr + row * 2 * N + N + offs, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)
    tl.store(out_ptr + row * N + offs, (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype),
             mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    t, two_n = gate_up.shape
    n = two_n // 2
    assert gate_up.is_contiguous()
    out = torch.empty((t, n), dtype=gate_up.dtype, device=gate_up.device)
    block = min(triton.next_power_of_2(n), 1024)
    _silu_and_mul_kernel[(t, triton.cdiv(n, block))](gate_up, out, N=n, BLOCK=block, num_warps=4)
    return out
