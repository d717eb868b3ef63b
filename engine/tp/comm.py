"""The workers' own process group: the all-reduces of every layer.

On CUDA the workers join NCCL's default group (one GPU per rank), and the all-reduces captured in
their CUDA graphs may go through symmetric memory instead (engine/tp/symm_allreduce.py: one-shot
over NVLink, PAGEDLAB_TP_ALLREDUCE); on a CPU they make a gloo group, which listens on the
loopback interface only: the workers run on this machine, and nothing from the network may reach
them. The engine process joins no group at all: it talks to the workers through shared memory
(engine/tp/link.py), so it may hold several engines, one per app session.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from engine.tp import fused_norm, symm_allreduce


def gloo_group(store: Any, name: str, rank: int, size: int, timeout_s: float) -> Any:
    """A gloo process group of `size` ranks that meet under `name` in `store` (blocks until all
    of them have joined), on the loopback interface."""
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timedelta(seconds=timeout_s)
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(dist.PrefixStore(name, store), rank, size, options)


class Reducer:
    """The workers' all-reduce: NCCL between GPUs (the process's default group, one GPU per
    rank), else a gloo group on the loopback interface. After `use_symmetric_memory`, the sums
    captured in CUDA graphs that the size rule takes run on symmetric memory instead."""

    def __init__(self, store: Any, rank: int, size: int, device: torch.device,
                 timeout_s: float) -> None:
        self.rank, self.size, self.device = rank, size, device
        self.nccl = device.type == "cuda"
        self.symm: symm_allreduce.SymmAllReduce | None = None
        self.fused: fused_norm.FusedNorm | None = None  # the graphs' sum + residual + norm
        self.info: dict[str, Any] = {"used": "nccl" if self.nccl else "gloo", "why": None}
        self.captured: Counter[str] = Counter()  # kernel -> all-reduces captured in graphs
        if self.nccl:
            dist.init_process_group("nccl", store=dist.PrefixStore("tp", store), rank=rank,
                                    world_size=size, device_id=device,
                                    timeout=timedelta(seconds=timeout_s))
        else:
            self.group = gloo_group(store, "tp", rank, size, timeout_s)

    def use_symmetric_memory(self, store: Any, nbytes: int, dtype: torch.dtype, graphs: bool,
                             log: Callable[[str], None] | None) -> None:
        """Set up the symmetric-memory all-reduce for the graphs' sums of up to `nbytes` of
        `dtype` (collective: every rank calls it, before any graph is captured), as
        PAGEDLAB_TP_ALLREDUCE says; on any failure every rank keeps NCCL, and `log` (rank 0's)
        gets one line saying why. `graphs`: whether the ranks capture any (else nothing to do)."""
        mode = symm_allreduce.allreduce_mode()
        self.info["requested"] = mode
        if not self.nccl:
            return
        if mode == "nccl" or not graphs:
            why = (f"{symm_allreduce.ENV}=nccl" if mode == "nccl"
                   else "no CUDA graphs to capture it in (PAGEDLAB_TP_GRAPHS=0)")
        else:
            self.symm, why = symm_allreduce.set_up(
                store, dist.group.WORLD.group_name, self.rank, self.size, self.device, dtype,
                nbytes, mode)
        if self.symm is None:
            self.info["why"] = f"symmetric memory not used: {why}"
        else:
            self.info |= {"used": "symm", **self.symm.describe()}
        if log is not None:
            log(f"[pagedlab] all-reduce: {symm_allreduce.summary(self.describe())}")

    def use_fused_norm(self, store: Any, rows: int, hidden: int, dtype: torch.dtype,
                       graphs: bool, log: Callable[[str], None] | None) -> None:
        """Set up the graphs' all-reduce fused with the norm after it (engine/tp/fused_norm.py)
        for up to `rows` rows of `hidden` (collective, after use_symmetric_memory, before any
        graph is captured); where it cannot, the sums stay as they were and `log` says why."""
        if not self.nccl:
            return
        if self.info.get("requested") == "nccl" or not graphs:
            why = f"{symm_allreduce.ENV}=nccl" if graphs else "no CUDA graphs to capture it in"
        else:
            self.fused, why = fused_norm.set_up(store, dist.group.WORLD.group_name, self.rank,
                                                self.size, self.device, dtype, rows, hidden)
        self.info["fused_norm"] = ("on" if self.fused is not None else f"off: {why}")
        if self.fused is not None:
            self.info |= self.fused.describe()
        if log is not None:
            log(f"[pagedlab] all-reduce + norm in one kernel: {self.info['fused_norm']}")

    def describe(self) -> dict[str, Any]:
        """Which all-reduce this rank uses (and why not the other), for engine_info."""
        return self.info | {"captured": dict(self.captured)}

    def sum_norm(self, h: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
        """add_rms_norm(sum of h over the ranks, residual, weight, eps) in one kernel, where a
        graph is being captured and the fused kernel takes h; None: sum and norm apart."""
        if (self.fused is None or not torch.cuda.is_current_stream_capturing()
                or not self.fused.applies(h, residual)):
            return None
        self.captured["fused_norm"] += 1
        return self.fused(h, residual, weight, eps)

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over the ranks: in place on NCCL and gloo, a new tensor on symmetric
        memory (the caller uses what is returned)."""
        if self.nccl and torch.cuda.is_current_stream_capturing():
            kernel = self.symm.kernel(t) if self.symm is not None else None
            self.captured[kernel or "nccl"] += 1
            if kernel is not None:
                return self.symm.reduce(t, kernel)
        return self._reduce(t, dist.ReduceOp.SUM)

    def min(self, t: torch.Tensor) -> torch.Tensor:
        return self._reduce(t, dist.ReduceOp.MIN)

    def _reduce(self, t: torch.Tensor, op: Any) -> torch.Tensor:
        if self.nccl:
            dist.all_reduce(t, op=op)
        else:
            options = dist.AllreduceOptions()
            options.reduceOp = op
            self.group.allreduce([t], options).wait()
        return t
