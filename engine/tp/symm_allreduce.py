"""The decode graphs' all-reduce over NVLink: PyTorch's symmetric memory, one-shot or two-shot.

Issue 43's first run on two H100s found a TP = 2 decode graph no faster than one GPU's: the 44
NCCL all-reduces of a 1.1B step (128 KB each at 32 sequences) cost what the halved weights saved.
An all-reduce this small is all latency. The one-shot all-reduce vLLM and SGLang use for it is
one kernel: each rank writes its partial sums into its slot of a buffer every GPU of the group
maps (symmetric memory: peer-to-peer over NVLink), the ranks meet at a barrier of flags written
into each other's memory, and each rank reads every slot and adds them in rank order, so every
rank holds the same sum, bit for bit. Two-shot: each rank adds up its 1/N of the buffer, then
gathers the others' sums; it moves no fewer bytes than one-shot between two GPUs (and needs one
more barrier), so it is for large messages on 4 or 8.

The kernels are PyTorch's own (`torch.ops.symm_mem`: `one_shot_all_reduce_copy`, which copies
the local input into the buffer inside the same kernel, and `two_shot_all_reduce_out`); only
these peer-to-peer kernels are used. NVLink multicast (the `multimem` kernels, NVLS) stays off
in every process here (TORCH_SYMM_MEM_DISABLE_MULTICAST=1; the set-up refuses to run without it).

Where it runs: only in the all-reduces captured in the workers' CUDA graphs (decode and
verification steps); an eager step (prefills, PAGEDLAB_TP_GRAPHS=0) and an all-reduce larger
than the rule below allows stay on NCCL, and a CPU on gloo, as before. PAGEDLAB_TP_ALLREDUCE:

- `auto` (the default): symmetric memory where it sets up (CUDA, 2, 4 or 8 GPUs that reach each
  other peer to peer), one-shot up to ONE_SHOT_MAX, two-shot up to TWO_SHOT_MAX, NCCL above;
- `symm`: the same, but a captured all-reduce above the one-shot limit runs two-shot, up to the
  buffer, rather than on NCCL;
- `nccl`: NCCL everywhere (issue 43's first run).

Setting up is collective and checked, step by step, every rank telling the others through the
workers' store: the checks, the buffer, the rendezvous, then a self-test (a sum of known values,
eager and replayed from a CUDA graph, with each kernel the rule may use). Any rank's failure makes
every rank fall back to NCCL, and worker 0 says why in one log line.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

MODES = ("auto", "symm", "nccl")
ENV = "PAGEDLAB_TP_ALLREDUCE"
KiB, MiB = 1024, 1024 * 1024
WORLDS = (2, 4, 8)  # the sizes PyTorch's two-shot kernel is built for (one-shot: any)
# One-shot up to these many bytes (vLLM's custom all-reduce runs one stage at any size on two
# GPUs, below 512 KB on four, 256 KB on eight); then two-shot (auto) up to TWO_SHOT_MAX; NCCL above.
ONE_SHOT_MAX = {2: 2 * MiB, 4: 512 * KiB, 8: 256 * KiB}
TWO_SHOT_MAX = {2: 0, 4: 8 * MiB, 8: 8 * MiB}
BUFFER_MAX = 16 * MiB  # a decode graph's largest all-reduce: 512 rows x 8,192 bf16 is 8 MiB
DTYPES = (torch.bfloat16, torch.float32)  # what the kernels add


def allreduce_mode(environ: Any = os.environ) -> str:
    """PAGEDLAB_TP_ALLREDUCE, checked: auto (unset), symm or nccl."""
    mode = environ.get(ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{ENV}={environ.get(ENV)!r}: must be one of {', '.join(MODES)}")
    return mode


@dataclass(frozen=True)
class SizeRule:
    """Which kernel an all-reduce of a given size runs: one-shot up to `one_shot_max` bytes,
    two-shot up to `two_shot_max`, None (NCCL) above."""

    one_shot_max: int
    two_shot_max: int

    def kernel(self, nbytes: int) -> str | None:
        if nbytes <= self.one_shot_max:
            return "one_shot"
        if nbytes <= self.two_shot_max:
            return "two_shot"
        return None


def size_rule(world: int, buffer_bytes: int, mode: str) -> SizeRule:
    """The rule for `world` ranks and a buffer of `buffer_bytes`; `symm` mode runs two-shot
    above the one-shot limit up to the buffer."""
    one = min(ONE_SHOT_MAX[world], buffer_bytes)
    two = buffer_bytes if mode == "symm" else min(TWO_SHOT_MAX[world], buffer_bytes)
    return SizeRule(one, max(one, two))


def buffer_bytes(rows: int, hidden: int, dtype: torch.dtype) -> int:
    """The symmetric buffer for a graph's largest all-reduce (`rows` tokens of `hidden`
    values), capped at BUFFER_MAX and rounded up to 16 bytes."""
    want = rows * hidden * torch.empty((), dtype=dtype).element_size()
    return min(BUFFER_MAX, -(-want // 16) * 16)


class SymmAllReduce:
    """A rendezvoused symmetric buffer of one dtype and the kernels that sum through it.
    `ops` is torch.ops.symm_mem (tests pass a stand-in); `fused_copy`: one_shot_all_reduce_copy
    (the local input copied into the buffer by the kernel itself) rather than a copy and then
    one_shot_all_reduce."""

    def __init__(self, buffer: torch.Tensor, group_name: str, rule: SizeRule,
                 ops: Any = None, fused_copy: bool = True) -> None:
        self.buffer, self.group_name, self.rule = buffer, group_name, rule
        self.ops = ops if ops is not None else torch.ops.symm_mem
        self.fused_copy = fused_copy
        self.nbytes = buffer.numel() * buffer.element_size()

    def kernel(self, t: torch.Tensor) -> str | None:
        """"one_shot", "two_shot", or None where NCCL must sum `t`: another dtype than the
        buffer's, not contiguous, a start not 16-byte aligned, a size not a multiple of 4
        bytes, or larger than the rule allows."""
        size = t.numel() * t.element_size()
        if (t.dtype != self.buffer.dtype or not t.is_contiguous() or size == 0 or size % 4
                or (t.storage_offset() * t.element_size()) % 16 or size > self.nbytes):
            return None
        return self.rule.kernel(size)

    def reduce(self, t: torch.Tensor, kernel: str) -> torch.Tensor:
        """The sum of `t` over the ranks, in a new tensor (`t` is left as it was)."""
        slot = self.buffer[:t.numel()].view(t.shape)
        if kernel == "one_shot":
            if self.fused_copy:
                return self.ops.one_shot_all_reduce_copy(slot, t, "sum", self.group_name)
            slot.copy_(t)
            return self.ops.one_shot_all_reduce(slot, "sum", self.group_name)
        slot.copy_(t)
        return self.ops.two_shot_all_reduce_out(slot, "sum", self.group_name, torch.empty_like(t))

    def describe(self) -> dict[str, Any]:
        return {"one_shot_max_bytes": self.rule.one_shot_max,
                "two_shot_max_bytes": self.rule.two_shot_max, "buffer_bytes": self.nbytes,
                "fused_copy": self.fused_copy}


def agree(store: Any, step: str, rank: int, world: int, problem: str | None) -> str | None:
    """Every rank's word on one set-up step, through the store: None when every rank
    succeeded, else the first failing rank's problem (the same answer on every rank)."""
    store.set(f"allreduce/{step}/{rank}", problem or "")
    for r in range(world):
        said = store.get(f"allreduce/{step}/{r}").decode()
        if said:
            return f"rank {r}, {step}: {said}"
    return None


def obstacle(mode: str, device: torch.device, world: int, dtype: torch.dtype) -> str | None:
    """Why symmetric memory cannot serve here, found without touching another rank (None:
    nothing in the way)."""
    if mode == "nccl":
        return f"{ENV}=nccl"
    if device.type != "cuda":
        return f"the ranks run on {device.type}, not CUDA"
    if world not in WORLDS:
        return f"{world} ranks (the peer-to-peer kernels are built for {WORLDS})"
    if dtype not in DTYPES:
        return f"{str(dtype).replace('torch.', '')} (the kernels add bfloat16 and float32)"
    if os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST") != "1":
        return "TORCH_SYMM_MEM_DISABLE_MULTICAST is not 1 (NVLink multicast must stay off)"
    try:
        import torch.distributed._symmetric_memory  # noqa: F401

        ops = torch.ops.symm_mem
        _ = (ops.one_shot_all_reduce, ops.two_shot_all_reduce_out)
    except (ImportError, AttributeError, RuntimeError) as err:
        return f"this torch has no symmetric-memory all-reduce ({err})"
    here = device.index or 0
    for peer in range(world):
        if peer != here and not torch.cuda.can_device_access_peer(here, peer):
            return f"GPU {here} cannot reach GPU {peer} peer to peer"
    return None


def problem_of(step: Callable[[], str | None]) -> str | None:
    """Run one set-up step; what went wrong, as one short line (None: nothing)."""
    try:
        return step()
    except Exception as err:  # noqa: BLE001 - any failure falls back to NCCL, with its reason
        text = str(err).strip().splitlines()
        return f"{type(err).__name__}: {text[0][:300] if text else ''}"


def set_up(store: Any, group_name: str, rank: int, world: int, device: torch.device,
           dtype: torch.dtype, nbytes: int, mode: str, backend: Any = None
           ) -> tuple[SymmAllReduce | None, str | None]:
    """The symmetric-memory all-reduce of this rank, set up together with the other ranks
    (collective: every rank calls it), or (None, why) on every rank if any rank failed.
    `backend`: the module with `empty` and `rendezvous` (torch.distributed._symmetric_memory;
    tests pass a stand-in, whose `symm_ops` replace torch.ops.symm_mem)."""
    made: dict[str, Any] = {}

    def allocate() -> None:
        made["mod"] = mod = backend if backend is not None else torch_symm_mem()
        size = nbytes // torch.empty((), dtype=dtype).element_size()
        made["buffer"] = mod.empty(size, dtype=dtype, device=device).zero_()

    def meet() -> str | None:
        mod = made["mod"]
        if _torch_version() < (2, 11) and hasattr(mod, "enable_symm_mem_for_group"):
            mod.enable_symm_mem_for_group(group_name)  # 2.11 finds the group's store itself
        handle = mod.rendezvous(made["buffer"], group_name)
        if handle is None:
            return "the rendezvous gave no handle"
        if hasattr(handle, "barrier"):
            handle.barrier()  # every rank has mapped every buffer before a kernel reads one
        made["symm"] = SymmAllReduce(made["buffer"], group_name, size_rule(world, nbytes, mode),
                                     ops=getattr(mod, "symm_ops", None))
        return None

    steps = (("check", lambda: obstacle(mode, device, world, dtype)), ("buffer", allocate),
             ("rendezvous", meet), ("self-test", lambda: self_test(made["symm"], rank, world)))
    for name, step in steps:
        why = agree(store, name, rank, world, problem_of(step))
        if why:
            return None, why
    return made["symm"], None


def self_test(symm: SymmAllReduce, rank: int, world: int) -> str | None:
    """Sum known values (rank + 1 on each rank) with every kernel the rule may use, eagerly and
    replayed from a CUDA graph: what went wrong, or None. A torch without the fused copy
    kernel gets a copy and one_shot_all_reduce instead."""
    kernels = ["one_shot"] + (["two_shot"] if symm.rule.two_shot_max > symm.rule.one_shot_max
                              else [])
    want = world * (world + 1) // 2
    n = min(symm.buffer.numel(), 4096)
    for kernel in kernels:
        x = torch.full((n,), float(rank + 1), dtype=symm.buffer.dtype, device=symm.buffer.device)
        try:
            eager = symm.reduce(x, kernel)
        except (RuntimeError, AttributeError):
            if kernel != "one_shot" or not symm.fused_copy:
                raise
            symm.fused_copy = False
            eager = symm.reduce(x, kernel)
        for how, y in (("eagerly", eager), ("in a CUDA graph", _replayed(symm, x, kernel))):
            if not bool((y == want).all()):
                got = f"{y.float().min().item():g}..{y.float().max().item():g}"
                return f"{kernel} {how} summed {got}, not {want}"
    return None


def _replayed(symm: SymmAllReduce, x: torch.Tensor, kernel: str) -> torch.Tensor:
    if x.device.type != "cuda":  # the CPU tests' stand-in: no graphs there
        return symm.reduce(x, kernel)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = symm.reduce(x, kernel)
    graph.replay()
    torch.cuda.synchronize(x.device)
    return y


def torch_symm_mem() -> Any:
    import torch.distributed._symmetric_memory as symm_mem

    return symm_mem


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def summary(info: dict[str, Any]) -> str:
    """One line for engine_info: which all-reduce the ranks use, where, and why not another."""
    used = info.get("used")
    if used == "gloo":
        return "gloo (CPU)"
    fused = f"; sum + norm in one kernel: {info['fused_norm']}" if info.get("fused_norm") else ""
    if used != "symm":
        return f"NCCL ({info.get('why')})" + fused
    one, two = info["one_shot_max_bytes"], info["two_shot_max_bytes"]
    sizes = f"one-shot up to {_size(one)}" + (f", two-shot up to {_size(two)}" if two > one else "")
    counts = info.get("captured") or {}
    caught = ", ".join(f"{n} {k.replace('_', '-')}" for k, n in sorted(counts.items()))
    return (f"symmetric memory in the CUDA graphs ({sizes}; NCCL above and in eager steps)"
            + (f"; captured at start: {caught}" if caught else "") + fused)


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n / KiB:g} KiB"
