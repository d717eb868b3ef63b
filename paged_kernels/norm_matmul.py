"""Triton kernels that fold the lean decoder's RMSNorm into the matmul after it, and its SiLU into
the gate/up matmul: two launches fewer per layer in a decode step.

In a decode step of a small model every launch costs a few microseconds, bytes or not (bench/NOTES
"What the three unmet rows need": ~320 kernels a step, the non-attention part 1.24 ms of a 1.95 ms
step). The norm needs a whole row before its first output, so it cannot live in a matmul's
epilogue; it can live in the next one's prologue, each program normalising the rows it multiplies
(a decode step's rows are few, and they sit in L2):

* `norm_linear`: (RMSNorm(x + residual) * norm_weight) @ weight.T (+ bias), and x + residual;
* `norm_gate_up_silu`: SiLU(gate) * up of the normed rows through the fused gate/up weight, and
  x + residual: the `[rows, 2 I]` gate/up output is never written.

The normed rows round exactly as `layer_ops.add_rms_norm` rounds them, and the output as
`layer_reference.silu_and_mul`; only the matmul's order of summation is the kernel's own (fp32
accumulation; full fp32 products for float32, as torch's matmul does by default). Prefill-sized
row counts keep cuBLAS: this is a decode kernel (`fits`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["MAX_ROWS", "fits", "norm_linear", "norm_gate_up_silu"]

#: the most rows the fused kernels take: a decode step's (prefill chunks are compute-bound, where
#: cuBLAS's tiles are the better matmul)
MAX_ROWS = 256


def fits(rows: int) -> bool:
    """Whether a step of `rows` tokens goes through the fused kernels."""
    return 0 < rows <= MAX_ROWS


@triton.jit
def _normed_rows(x_ptr, res_ptr, res_out_ptr, w_norm_ptr, rows, offs_m, rstd, k0, K, res_rows,
                 BLOCK_K: tl.constexpr, HAS_RES: tl.constexpr):
    """Columns k0 .. k0 + BLOCK_K of the normed rows, rounded as add_rms_norm rounds them; x +
    residual stored too, for rows below `res_rows` (`rows` in one program of a row tile, else 0)."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    mask = (offs_m[:, None] < rows) & (offs_k[None, :] < K)
    at = offs_m[:, None].to(tl.int64) * K + offs_k[None, :]
    x = tl.load(x_ptr + at, mask=mask, other=0.0)
    if HAS_RES:
        x = (x.to(tl.float32) + tl.load(res_ptr + at, mask=mask, other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(res_out_ptr + at, x, mask=(offs_m[:, None] < res_rows) & (offs_k[None, :] < K))
    w = tl.load(w_norm_ptr + offs_k, mask=offs_k < K, other=0.0)
    return (w[None, :].to(tl.float32) * (x.to(tl.float32) * rstd[:, None]).to(x.dtype)
            .to(tl.float32)).to(x.dtype)


@triton.jit
def _row_rstd(x_ptr, res_ptr, rows, offs_m, K, eps, BLOCK_K: tl.constexpr, HAS_RES: tl.constexpr):
    """1 / sqrt(mean((x + residual)^2) + eps) of each row, the sum rounded to the rows' dtype."""
    sq = tl.zeros((offs_m.shape[0],), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask = (offs_m[:, None] < rows) & (offs_k[None, :] < K)
        at = offs_m[:, None].to(tl.int64) * K + offs_k[None, :]
        x = tl.load(x_ptr + at, mask=mask, other=0.0)
        if HAS_RES:
            x = (x.to(tl.float32) + tl.load(res_ptr + at, mask=mask, other=0.0).to(tl.float32)).to(x.dtype)
        h = x.to(tl.float32)
        sq += tl.sum(h * h, axis=1)
    return 1.0 / tl.sqrt(sq / K + eps)


@triton.jit
def _weight_tile(w_ptr, offs_n, n_rows, k0, K, BLOCK_K: tl.constexpr):
    """weight[offs_n, k0 .. k0 + BLOCK_K], transposed to [BLOCK_K, BLOCK_N] for the dot."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    mask = (offs_n[:, None] < n_rows) & (offs_k[None, :] < K)
    tile = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :], mask=mask, other=0.0)
    return tl.trans(tile)


@triton.jit
def _norm_linear_kernel(x_ptr, res_ptr, res_out_ptr, w_norm_ptr, w_ptr, b_ptr, out_ptr, rows, N,
                        K, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, HAS_RES: tl.constexpr, HAS_BIAS: tl.constexpr,
                        IEEE: tl.constexpr):
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rstd = _row_rstd(x_ptr, res_ptr, rows, offs_m, K, eps, BLOCK_K, HAS_RES)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = _normed_rows(x_ptr, res_ptr, res_out_ptr, w_norm_ptr, rows, offs_m, rstd, k0, K,
                         tl.where(pid_n == 0, rows, 0), BLOCK_K, HAS_RES)
        b = _weight_tile(w_ptr, offs_n, N, k0, K, BLOCK_K)
        acc = tl.dot(a, b, acc, input_precision="ieee" if IEEE else "tf32")
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    mask = (offs_m[:, None] < rows) & (offs_n[None, :] < N)
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _norm_gate_up_silu_kernel(x_ptr, res_ptr, res_out_ptr, w_norm_ptr, w_ptr, out_ptr, rows, N,
                              K, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_K: tl.constexpr, HAS_RES: tl.constexpr, IEEE: tl.constexpr):
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rstd = _row_rstd(x_ptr, res_ptr, rows, offs_m, K, eps, BLOCK_K, HAS_RES)
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = _normed_rows(x_ptr, res_ptr, res_out_ptr, w_norm_ptr, rows, offs_m, rstd, k0, K,
                         tl.where(pid_n == 0, rows, 0), BLOCK_K, HAS_RES)
        gate = tl.dot(a, _weight_tile(w_ptr, offs_n, N, k0, K, BLOCK_K), gate,
                      input_precision="ieee" if IEEE else "tf32")
        up = tl.dot(a, _weight_tile(w_ptr + N * K, offs_n, N, k0, K, BLOCK_K), up,
                    input_precision="ieee" if IEEE else "tf32")
    dtype = out_ptr.dtype.element_ty
    g = gate.to(dtype).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    out = act * up.to(dtype).to(tl.float32)
    mask = (offs_m[:, None] < rows) & (offs_n[None, :] < N)
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :], out.to(dtype), mask=mask)


def _grid_shape(rows: int, n: int, device: torch.device) -> tuple[int, int, int]:
    """BLOCK_M, BLOCK_N, BLOCK_K: the rows in one tile (tl.dot takes 16 and up), and output
    columns narrow enough that the programs fill the GPU's SMs (a decode step's matmul is bytes
    of weight, read best by every SM at once)."""
    block_m = min(max(16, triton.next_power_of_2(rows)), 64)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    block_n = 128
    while block_n > 16 and triton.cdiv(n, block_n) * triton.cdiv(rows, block_m) < sms:
        block_n //= 2
    return block_m, block_n, 64  # K tiles of 64: gate/up's two weight tiles, three stages deep,
    # fit the shared memory with 64 rows and 128 columns (tiles of 128 asked 264 KiB of 227)


def _checked(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor) -> None:
    assert x.is_contiguous() and weight.is_contiguous() and fits(x.shape[0])
    assert residual is None or (residual.is_contiguous() and residual.shape == x.shape)
    assert weight.shape[-1] == x.shape[1], "the weight's columns must be the rows' width"


def norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                eps: float, weight: torch.Tensor, bias: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(F.linear(add_rms_norm(x, residual, norm_weight, eps)[0], weight, bias), x + residual)."""
    _checked(x, residual, weight)
    rows, k = x.shape
    n = weight.shape[0]
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else x
    bm, bn, bk = _grid_shape(rows, n, x.device)
    _norm_linear_kernel[(triton.cdiv(n, bn), triton.cdiv(rows, bm))](
        x, residual if residual is not None else x, res_out, norm_weight, weight,
        bias if bias is not None else weight, out, rows, n, k, eps, BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_K=bk, HAS_RES=residual is not None, HAS_BIAS=bias is not None,
        IEEE=x.dtype == torch.float32, num_warps=4, num_stages=3)
    return out, res_out


def norm_gate_up_silu(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                      eps: float, gate_up_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(silu_and_mul(F.linear(add_rms_norm(x, residual, norm_weight, eps)[0], gate_up_weight)),
    x + residual); `gate_up_weight` is `[2 I, hidden]`, gate rows then up rows."""
    _checked(x, residual, gate_up_weight)
    rows, k = x.shape
    n = gate_up_weight.shape[0] // 2
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else x
    bm, bn, bk = _grid_shape(rows, n, x.device)
    _norm_gate_up_silu_kernel[(triton.cdiv(n, bn), triton.cdiv(rows, bm))](
        x, residual if residual is not None else x, res_out, norm_weight, gate_up_weight, out,
        rows, n, k, eps, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, HAS_RES=residual is not None,
        IEEE=x.dtype == torch.float32, num_warps=4, num_stages=3)
    return out, res_out
