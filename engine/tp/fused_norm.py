"""The decode graphs' all-reduce fused with the norm after it: paged_kernels/lamport.py, set up here.

Issue 43's second run left a TP = 2 decode graph of the 1.1B shape at 1.74 ms against one GPU's
1.62: its 44 all-reduces on symmetric memory took 9-13 us each (two barriers of flags over
NVLink), and an `add_rms_norm` launch followed each. The Lamport kernel needs no barrier (an
element's value is its own ready flag) and does the residual add and RMSNorm in the same launch,
so each of the 44 costs one launch where it cost two.

Where it runs: a CUDA graph's sum of up to `rows` rows and MAX_BYTES that a norm follows (every row-parallel
output of the lean decoder: engine/runtime/lean_decoder.py), with a residual, in the dtype it
was set up for. Anything else (eager steps, larger batches, the module path) keeps the reducer's
other kernels. PAGEDLAB_TP_FUSED_NORM=0 turns it off (the bench measures both).

Setting up is collective and agreed step by step through the workers' store, as
symm_allreduce.set_up: the checks, each rank's buffer (symmetric memory, emptied), the
rendezvous (every rank's buffer address), then a self-test: known values summed and normalised
eagerly and from a replayed CUDA graph, with row counts that make the slots come round. Any
rank's failure leaves every rank without it, and worker 0 says why.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from engine.tp.symm_allreduce import agree, problem_of, torch_symm_mem

ENV = "PAGEDLAB_TP_FUSED_NORM"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Up to these many bytes a sum it takes (two H100s, run 3: 4.6 / 5.5 / 8.8 us at 16 / 128 /
# 512 KiB against 10.3 / 11.4 / 14.9 for one-shot then add_rms_norm; 52.0 against 25.9 at 2 MiB,
# a program per row of 512): above, the sum and the norm stay apart.
MAX_BYTES = 512 * 1024


class FusedNorm:
    """This rank's buffer, every rank's buffer address and the kernel's state."""

    def __init__(self, buffer: torch.Tensor, peers: torch.Tensor, rank: int, world: int,
                 rows: int, hidden: int) -> None:
        from paged_kernels.lamport import STATE_INTS

        self.buffer, self.peers, self.rank, self.world = buffer, peers, rank, world
        self.rows, self.hidden = rows, hidden
        self.state = torch.zeros(STATE_INTS, dtype=torch.int32, device=buffer.device)

    def applies(self, h: torch.Tensor, residual: torch.Tensor | None) -> bool:
        return (residual is not None and h.dtype == self.buffer.dtype and h.dim() == 2
                and h.shape[1] == self.hidden and 0 < h.shape[0] <= self.rows
                and h.numel() * h.element_size() <= MAX_BYTES
                and h.is_contiguous() and residual.is_contiguous())

    def __call__(self, h: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        from paged_kernels.lamport import reduce_add_rms_norm

        return reduce_add_rms_norm(h, residual, weight, eps, self.peers, self.state, self.rank,
                                   self.world, self.rows)

    def describe(self) -> dict[str, Any]:
        return {"fused_norm_rows": self.rows, "fused_norm_buffer_bytes":
                self.buffer.numel() * self.buffer.element_size()}


def obstacle(device: torch.device, world: int, dtype: torch.dtype) -> str | None:
    """Why the fused kernel cannot serve here, found without another rank (None: nothing)."""
    if os.environ.get(ENV, "1").strip() == "0":
        return f"{ENV}=0"
    if device.type != "cuda":
        return f"the ranks run on {device.type}, not CUDA"
    if world not in (2, 4, 8):
        return f"{world} ranks"
    if dtype not in DTYPES:
        return f"{str(dtype).replace('torch.', '')} (it adds bfloat16, float16 and float32)"
    if os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST") != "1":
        return "TORCH_SYMM_MEM_DISABLE_MULTICAST is not 1 (NVLink multicast must stay off)"
    return None


def set_up(store: Any, group_name: str, rank: int, world: int, device: torch.device,
           dtype: torch.dtype, rows: int, hidden: int) -> tuple[FusedNorm | None, str | None]:
    """This rank's FusedNorm, set up with the other ranks (collective), or (None, why) on every
    rank if any rank failed."""
    from paged_kernels.lamport import buffer_elements, empty_bits

    made: dict[str, Any] = {}

    def allocate() -> None:
        made["mod"] = mod = torch_symm_mem()
        buf = mod.empty(buffer_elements(world, rows, hidden), dtype=dtype, device=device)
        ints, empty = empty_bits(dtype)
        buf.view(ints).fill_(empty)
        made["buffer"] = buf

    def meet() -> str | None:
        handle = made["mod"].rendezvous(made["buffer"], group_name)
        ptrs = list(getattr(handle, "buffer_ptrs", None) or [])
        if len(ptrs) != world:
            return f"the rendezvous gave {len(ptrs)} buffer addresses for {world} ranks"
        if ptrs[rank] != made["buffer"].data_ptr():
            return "this rank's buffer is not at the start of its symmetric allocation"
        peers = torch.tensor(ptrs, dtype=torch.int64, device=device)
        torch.cuda.synchronize(device)
        handle.barrier()  # every rank's buffer emptied and mapped before any kernel writes
        made["fused"] = FusedNorm(made["buffer"], peers, rank, world, rows, hidden)
        return None

    steps = (("fused-norm check", lambda: obstacle(device, world, dtype)),
             ("fused-norm buffer", allocate), ("fused-norm rendezvous", meet),
             ("fused-norm self-test", lambda: self_test(made["fused"])))
    for name, step in steps:
        why = agree(store, name, rank, world, problem_of(step))
        if why:
            return None, why
    return made["fused"], None


def self_test(fused: FusedNorm) -> str | None:
    """Each rank's part is rank + 1 everywhere, the residual 1 and the weight 2: every row sums
    to S = world (world + 1) / 2, plus 1, and normalises to 2 (a constant row's RMS is itself).
    Row counts 1, all and 3 eagerly (the slots come round), then a graph replayed three times.
    What went wrong, or None."""
    world, rows, n = fused.world, fused.rows, fused.hidden
    dev, dt = fused.buffer.device, fused.buffer.dtype
    want = world * (world + 1) // 2 + 1
    weight = torch.full((n,), 2.0, dtype=dt, device=dev)

    def call(t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.full((t, n), float(fused.rank + 1), dtype=dt, device=dev)
        res = torch.ones((t, n), dtype=dt, device=dev)
        return (x, res, *fused(x, res, weight, 1e-6))

    def wrong(out: torch.Tensor, res_out: torch.Tensor, how: str) -> str | None:
        if bool((res_out == want).all()) and bool(((out.float() - 2).abs() < 0.02).all()):
            return None
        return (f"{how}: summed {res_out.float().min().item():g}..{res_out.float().max().item():g}"
                f" (want {want}), normalised {out.float().min().item():g}..{out.float().max().item():g}")

    for t in (1, rows, min(3, rows)):
        _, _, out, res_out = call(t)
        if problem := wrong(out, res_out, f"{t} rows eagerly"):
            return problem
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, _, out, res_out = call(min(2, rows))
    for i in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize(dev)
        if problem := wrong(out, res_out, f"replay {i + 1} of a graph"):
            return problem
    if int(fused.state[5].item()):
        return "a spin timed out"
    return None
