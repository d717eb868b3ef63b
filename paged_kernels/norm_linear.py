"""Triton kernels that fold the lean decoder's RMSNorm into the projection after it.

In a decode step every layer runs `add_rms_norm` and then a matmul twice (before qkv, before
gate/up), and `silu_and_mul` after gate/up: three launches a layer that move almost no bytes but
each cost the GPU a launch and a kernel's ramp (a 32-sequence step of a 135M model is ~300
launches, most of its time). Here they are one kernel each:

* `norm_linear`: x = h + residual; y = RMSNorm(x) * w_norm; out = y @ W.T (+ bias);
* `norm_silu_mlp`: the same into the fused gate/up weight, with SiLU(gate) * up as the epilogue,
  each program holding the gate columns and the up columns of the same features.

One program computes a [BLOCK_M rows x BLOCK_N features] tile: it reads its rows once to sum
their squares (program 0 of each row tile also writes the summed residual), then streams its
weight rows, normalising the activations tile by tile. Each program re-reads the activations
(a few KB from L2) rather than the norm being a kernel of its own, which pays only for few rows:
`fused_rows` says where, and larger batches (prefill) take the separate kernels.

Rounding follows `layer_reference.py` (the modules' order: the sum, the normalised value and
the weighted one each rounded to the model's dtype; the matmul accumulated in float32 and rounded
once), so the fused path agrees with the separate kernels up to the matmul's summation order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import layer_ops

__all__ = ["norm_linear", "norm_silu_mlp", "fused_rows"]

#: Rows a step may have for the fused kernels (decode batches); more go the separate way.
MAX_FUSED_ROWS = 64
#: Benchmarks may set any of block_n / block_k / num_warps / num_stages to sweep the launch.
CONFIG_OVERRIDE: dict | None = None


def fused_rows(x: torch.Tensor) -> bool:
    """Whether a projection of `x` goes through the fused kernels: a decode batch in half
    precision. A GPU's float32 keeps the library's matmul, which the tests hold equal to the
    modules' to the bit; on a CPU (Triton's interpreter: the tests) every dtype is fused."""
    return x.shape[0] <= MAX_FUSED_ROWS and (x.dtype != torch.float32 or x.device.type == "cpu")


@triton.jit
def _load_sum(x_ptr, res_ptr, rows, offs_k, mask, HAS_RES: tl.constexpr):
    """The residual stream's rows: h (+ residual), rounded to the model's dtype."""
    x = tl.load(x_ptr + rows + offs_k[None, :], mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + rows + offs_k[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def _norm_linear_kernel(x_ptr, res_ptr, nw_ptr, w_ptr, b_ptr, out_ptr, res_out_ptr, eps, M, N,
                        K: tl.constexpr, HAS_RES: tl.constexpr, HAS_BIAS: tl.constexpr,
                        SILU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    pid_n = tl.program_id(0)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    rows = offs_m.to(tl.int64)[:, None] * K
    dtype = x_ptr.dtype.element_ty

    sumsq = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask = m_mask[:, None] & (offs_k[None, :] < K)
        x = _load_sum(x_ptr, res_ptr, rows, offs_k, mask, HAS_RES)
        if HAS_RES:
            if pid_n == 0:
                tl.store(res_out_ptr + rows + offs_k[None, :], x, mask=mask)
        xf = x.to(tl.float32)
        sumsq += tl.sum(xf * xf, axis=1)
    rstd = 1.0 / tl.sqrt(sumsq / K + eps)

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    w_rows = offs_n.to(tl.int64)[:, None] * K
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = _load_sum(x_ptr, res_ptr, rows, offs_k, m_mask[:, None] & k_mask[None, :], HAS_RES)
        nw = tl.load(nw_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)
        y = (nw[None, :] * (x.to(tl.float32) * rstd[:, None]).to(dtype).to(tl.float32)).to(dtype)
        w_mask = n_mask[:, None] & k_mask[None, :]
        w = tl.load(w_ptr + w_rows + offs_k[None, :], mask=w_mask, other=0.0)
        if UPCAST:  # the CPU interpreter's dot of 16-bit floats is wrong: exact float32 there
            y = y.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(y, tl.trans(w), acc)
        if SILU:  # the up rows sit N rows after the gate rows of the same features
            u = tl.load(w_ptr + N * K + w_rows + offs_k[None, :], mask=w_mask, other=0.0)
            if UPCAST:
                u = u.to(tl.float32)
            acc_up = tl.dot(y, tl.trans(u), acc_up)

    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out = acc.to(dtype)
    if SILU:  # as silu_and_mul: SiLU of the rounded gate, rounded, times the rounded up
        g = out.to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
        out = (act * acc_up.to(dtype).to(tl.float32)).to(dtype)
    tl.store(out_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :], out,
             mask=m_mask[:, None] & n_mask[None, :])


def _launch(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
            weight: torch.Tensor, bias: torch.Tensor | None, silu: bool
            ) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    n = weight.shape[0] // 2 if silu else weight.shape[0]
    assert x.is_contiguous() and weight.is_contiguous() and weight.shape[1] == k
    assert residual is None or residual.is_contiguous()
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else x
    block_m = min(64, max(16, triton.next_power_of_2(m)))  # more rows: more row tiles
    # Enough programs to keep the SMs' loads in flight: narrow tiles for narrow outputs.
    cfg = {"block_n": 16 if n <= 2048 else (32 if n <= 8192 else 64), "num_warps": 4,
           "num_stages": 3, "block_k": 64, **(CONFIG_OVERRIDE or {})}
    grid = (triton.cdiv(n, cfg["block_n"]), triton.cdiv(m, block_m))
    _norm_linear_kernel[grid](
        x, residual if residual is not None else x, norm_weight, weight,
        bias if bias is not None else norm_weight, out, res_out, eps, m, n,
        K=k, HAS_RES=residual is not None, HAS_BIAS=bias is not None, SILU=silu,
        BLOCK_M=block_m, BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"], UPCAST=x.device.type == "cpu",
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return out, res_out


def norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                eps: float, weight: torch.Tensor, bias: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear(RMSNorm(x + residual) * norm_weight, weight, bias), x + residual)."""
    if not fused_rows(x):
        normed, summed = layer_ops.add_rms_norm(x, residual, norm_weight, eps)
        return torch.nn.functional.linear(normed, weight, bias), summed
    return _launch(x, residual, norm_weight, eps, weight, bias, silu=False)


def norm_silu_mlp(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                  eps: float, gate_up_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(SiLU(gate) * up of RMSNorm(x + residual) * norm_weight through the fused gate/up
    weight `[2 I, hidden]`, x + residual): the MLP up to its down projection."""
    if not fused_rows(x):
        normed, summed = layer_ops.add_rms_norm(x, residual, norm_weight, eps)
        return layer_ops.silu_and_mul(torch.nn.functional.linear(normed, gate_up_weight)), summed
    return _launch(x, residual, norm_weight, eps, gate_up_weight, None, silu=True)
