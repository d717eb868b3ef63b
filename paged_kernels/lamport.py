"""The all-reduce of a row-parallel output fused with the residual add and RMSNorm after it, in
one kernel with no barrier (a Lamport all-reduce, as TensorRT-LLM's and FlashInfer's).

Issue 43's decode graphs spent their time in the all-reduces: a one-shot all-reduce on
symmetric memory meets the other ranks at two barriers of flags over NVLink (9-13 us on two
H100s), then an `add_rms_norm` launch follows. Here each rank's buffer, mapped by every rank,
holds three slots, each with a region per rank; an empty element holds -0.0 (the sign bit alone).

One program per token row:

1. writes its row of partial sums (a -0.0 written as +0.0: the sum is the same) into its own
   region of the current slot in every rank's buffer, over NVLink;
2. reads its own buffer's regions of that slot, each element until it is no longer empty (the
   value is its own ready flag: no barrier), and adds them in rank order, in float32, rounded once
   to the model's dtype, as the one-shot kernel does;
3. adds the residual and normalises exactly as `layer_ops.add_rms_norm`;
4. empties its rows of the slot used two calls ago (no rank writes there again before the next
   call has met this rank's data, so no barrier is needed for that either);
5. counts itself done; the last program of the launch moves the slot on (the next launch, and a
   CUDA graph's next replay, read it from the state tensor on the device).

The state (int32, per rank): [slot, programs done, rows written in slot 0, 1, 2, timed out].
A spin that lasts MAX_SPIN reads (a rank gone) gives up: the row is written as NaN and the
state's `timed out` is set, rather than hanging the GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["SLOTS", "STATE_INTS", "buffer_elements", "empty_bits", "reduce_add_rms_norm"]

SLOTS = 3
STATE_INTS = 8
MAX_SPIN = 1 << 24
_BITS = {torch.bfloat16: 16, torch.float16: 16, torch.float32: 32}


def buffer_elements(world: int, rows: int, hidden: int) -> int:
    """Elements of one rank's buffer: SLOTS slots of `world` regions of `rows` x `hidden`."""
    return SLOTS * world * rows * hidden


def empty_bits(dtype: torch.dtype) -> tuple[torch.dtype, int]:
    """The integer view of `dtype` and the value that marks an element empty (-0.0)."""
    if _BITS.get(dtype) == 16:
        return torch.int16, -(1 << 15)
    if _BITS.get(dtype) == 32:
        return torch.int32, -(1 << 31)
    raise ValueError(f"the fused all-reduce adds bfloat16, float16 and float32, not {dtype}")


@triton.jit
def _is_empty(v, BITS: tl.constexpr):
    if BITS == 16:  # one branch compiled (a return inside would compile the other too)
        empty = v.to(tl.int16, bitcast=True) == -32768
    else:
        empty = v.to(tl.int32, bitcast=True) == -2147483648
    return empty


@triton.jit
def _lamport_add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, peers_ptr,
                                 state_ptr, eps, T, N: tl.constexpr, BLOCK: tl.constexpr,
                                 RANK: tl.constexpr, WORLD: tl.constexpr, ROWS: tl.constexpr,
                                 BITS: tl.constexpr, HAS_RES: tl.constexpr,
                                 MAX_SPIN: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    dtype = x_ptr.dtype.element_ty
    slot = tl.load(state_ptr, volatile=True).to(tl.int64)
    region = ROWS * N  # one rank's part of a slot
    here = slot * WORLD * region + row * N + offs  # this row in slot `slot`, region 0
    x = tl.load(x_ptr + row * N + offs, mask=mask, other=0.0)
    x = tl.where(_is_empty(x, BITS), tl.zeros([BLOCK], dtype), x)  # -0.0 is empty: send +0.0
    for q in tl.static_range(WORLD):
        peer = tl.load(peers_ptr + q).to(tl.pointer_type(dtype))
        tl.store(peer + here + RANK * region, x, mask=mask)
    own = tl.load(peers_ptr + RANK).to(tl.pointer_type(dtype))
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    late = 0
    for q in tl.static_range(WORLD):
        v = tl.load(own + here + q * region, mask=mask, other=0.0, volatile=True)
        spins = 0
        while (tl.sum((_is_empty(v, BITS) & mask).to(tl.int32), axis=0) > 0) & (spins < MAX_SPIN):
            v = tl.load(own + here + q * region, mask=mask, other=0.0, volatile=True)
            spins += 1
        late += (spins >= MAX_SPIN).to(tl.int32)
        acc += v.to(tl.float32)
    h = acc.to(dtype)
    if late > 0:
        h = tl.full([BLOCK], float("nan"), tl.float32).to(dtype)
        tl.store(state_ptr + 5, 1)
    if HAS_RES:
        h = (h.to(tl.float32) + tl.load(res_ptr + row * N + offs, mask=mask, other=0.0)
             .to(tl.float32)).to(dtype)
    tl.store(res_out_ptr + row * N + offs, h, mask=mask)
    f = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(f * f, axis=0) / N + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + row * N + offs, (w.to(tl.float32) * (f * rstd).to(dtype).to(tl.float32))
             .to(dtype), mask=mask)
    # empty this row's share of the slot used two calls ago (its rows may have outnumbered ours)
    old = (slot + 2) % 3
    old_rows = tl.load(state_ptr + 2 + old, volatile=True)
    if BITS == 16:
        mark = tl.full([BLOCK], -32768, tl.int16).to(dtype, bitcast=True)
    else:
        mark = tl.full([BLOCK], -2147483648, tl.int32).to(dtype, bitcast=True)
    r = row
    while r < old_rows:
        for q in tl.static_range(WORLD):
            tl.store(own + old * WORLD * region + q * region + r * N + offs, mark, mask=mask)
        r += T
    tl.store(state_ptr + 2 + slot, T)
    done = tl.atomic_add(state_ptr + 1, 1)
    if done == T - 1:  # the launch's last program: the next call uses the next slot
        tl.store(state_ptr + 1, 0)
        tl.store(state_ptr, (slot + 1) % 3)


def reduce_add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                        eps: float, peers: torch.Tensor, state: torch.Tensor, rank: int,
                        world: int, rows: int, max_spin: int = MAX_SPIN
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(sum over ranks of x + residual) * weight, sum + residual), as
    `layer_ops.add_rms_norm(all_reduce(x), residual, weight, eps)`. `peers`: int64, the address
    of every rank's buffer (buffer_elements(world, rows, hidden) elements of x's dtype, emptied
    before the first call) as this process maps it; `state`: this rank's STATE_INTS int32,
    zeros before the first call. Every rank must make the same calls in the same order."""
    t, n = x.shape
    if t > rows:
        raise ValueError(f"{t} rows: the fused all-reduce's buffer holds {rows}")
    assert x.is_contiguous() and (residual is None or residual.is_contiguous())
    out, res_out = torch.empty_like(x), torch.empty_like(x)
    block = triton.next_power_of_2(n)
    _lamport_add_rms_norm_kernel[(t,)](
        x, residual if residual is not None else x, weight, out, res_out, peers, state, eps, t,
        N=n, BLOCK=block, RANK=rank, WORLD=world, ROWS=rows, BITS=_BITS[x.dtype],
        HAS_RES=residual is not None, MAX_SPIN=max_spin, num_warps=4 if block >= 1024 else 2)
    return out, res_out
