"""The symmetric-memory all-reduce's logic without a GPU (engine/tp/symm_allreduce.py): the
switch, the size rule, which tensors it takes, the collective set-up and its fallback to NCCL
(ranks are threads here, and a stand-in plays symmetric memory: every rank's buffer in one
dict, the kernels' barriers a threading.Barrier), and the Reducer's choice between the two.
The kernels themselves run on two GPUs: tests/engine/tp/test_tp_gpu.py, bench/tp_allreduce.py.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist

from engine.tp import symm_allreduce as sa
from engine.tp.comm import Reducer

KiB, MiB = sa.KiB, sa.MiB


def test_the_switch_reads_auto_symm_or_nccl():
    assert sa.allreduce_mode({}) == "auto"
    assert sa.allreduce_mode({sa.ENV: " SYMM "}) == "symm"
    assert sa.allreduce_mode({sa.ENV: "nccl"}) == "nccl"
    with pytest.raises(ValueError, match="must be one of auto, symm, nccl"):
        sa.allreduce_mode({sa.ENV: "fast"})


def test_size_rule_one_shot_for_decode_messages_nccl_above():
    two = sa.size_rule(2, 16 * MiB, "auto")
    # the 1.1B shape's 32 x 2,048 bf16 (128 KB) and the 8B's 64 x 4,096 (512 KB): one-shot
    assert two.kernel(128 * KiB) == two.kernel(512 * KiB) == two.kernel(2 * MiB) == "one_shot"
    assert two.kernel(2 * MiB + 16) is None  # two GPUs: two-shot moves no fewer bytes
    assert sa.size_rule(2, 16 * MiB, "symm").kernel(4 * MiB) == "two_shot"
    assert sa.size_rule(2, 16 * MiB, "symm").kernel(16 * MiB + 16) is None  # past the buffer
    eight = sa.size_rule(8, 16 * MiB, "auto")
    assert (eight.kernel(256 * KiB), eight.kernel(MiB), eight.kernel(9 * MiB)) == (
        "one_shot", "two_shot", None)
    small = sa.size_rule(2, 64 * KiB, "auto")  # a buffer smaller than the limit caps it
    assert (small.kernel(64 * KiB), small.kernel(64 * KiB + 16)) == ("one_shot", None)


def test_buffer_holds_a_graphs_largest_all_reduce():
    assert sa.buffer_bytes(64, 4096, torch.bfloat16) == 512 * KiB
    assert sa.buffer_bytes(3, 5, torch.float32) == 64  # 60 bytes, rounded up to 16
    assert sa.buffer_bytes(512 * 5, 8192, torch.float32) == sa.BUFFER_MAX


def test_kernel_takes_only_what_the_buffer_can_sum():
    buf = torch.zeros(1024, dtype=torch.bfloat16)
    symm = sa.SymmAllReduce(buf, "g", sa.size_rule(2, 2048, "auto"), ops=object())
    assert symm.kernel(torch.ones(4, 64, dtype=torch.bfloat16)) == "one_shot"
    assert symm.kernel(torch.ones(4, 64, dtype=torch.float32)) is None  # another dtype
    assert symm.kernel(torch.ones(64, 4, dtype=torch.bfloat16).t()) is None  # not contiguous
    assert symm.kernel(torch.ones(65, dtype=torch.bfloat16)[1:]) is None  # starts 2 bytes in
    assert symm.kernel(torch.ones(3, dtype=torch.bfloat16)) is None  # 6 bytes
    assert symm.kernel(torch.ones(1032, dtype=torch.bfloat16)) is None  # past the buffer


def test_obstacles_are_named():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert sa.obstacle("nccl", cuda, 2, torch.bfloat16) == f"{sa.ENV}=nccl"
    assert "not CUDA" in sa.obstacle("auto", cpu, 2, torch.bfloat16)
    assert "3 ranks" in sa.obstacle("auto", cuda, 3, torch.bfloat16)
    assert "float16" in sa.obstacle("symm", cuda, 2, torch.float16)


def test_multicast_must_be_off(monkeypatch):
    monkeypatch.delenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", raising=False)
    assert "multicast" in sa.obstacle("auto", torch.device("cuda", 0), 2, torch.float32)


class _Symmetric:
    """Symmetric memory among threads: one dict of every rank's buffer, a barrier for the
    kernels' two; `fail`: (step, rank) that raises; `wrong`: kernels that do not sum."""

    def __init__(self, world: int, fail: tuple[str, int] | None = None, wrong: bool = False,
                 fused: bool = True) -> None:
        self.world, self.fail, self.wrong, self.fused = world, fail, wrong, fused
        self.buffers: dict[int, torch.Tensor] = {}
        self.barrier = threading.Barrier(world, timeout=20)

    def backend(self, rank: int) -> Any:
        group = self

        class Ops:
            def one_shot_all_reduce(self, slot, op, name):
                return group.sum(slot)

            def two_shot_all_reduce_out(self, slot, op, name, out):
                return out.copy_(group.sum(slot))

        ops = Ops()
        if self.fused:
            ops.one_shot_all_reduce_copy = lambda slot, local, op, name: group.sum(
                slot.copy_(local))

        def empty(n: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
            if self.fail == ("buffer", rank):
                raise RuntimeError("CUDA driver error: out of memory")
            self.buffers[rank] = torch.empty(n, dtype=dtype)
            return self.buffers[rank]

        def rendezvous(buf: torch.Tensor, name: str) -> Any:
            if self.fail == ("rendezvous", rank):
                raise RuntimeError("cuMemImportFromShareableHandle failed\nmore lines")
            return SimpleNamespace(barrier=lambda: None)

        return SimpleNamespace(empty=empty, rendezvous=rendezvous, symm_ops=ops)

    def sum(self, slot: torch.Tensor) -> torch.Tensor:
        n = slot.numel()
        self.barrier.wait()  # every rank's partial sums are in
        total = slot.clone() if self.wrong else sum(
            self.buffers[r][:n] for r in range(self.world)).view(slot.shape)
        self.barrier.wait()  # every rank has read them
        return total


def _set_up_all(group: _Symmetric, monkeypatch, mode: str = "auto") -> list[tuple[Any, Any]]:
    """set_up on `group.world` threads (the check that wants CUDA skipped); each rank's result."""
    monkeypatch.setattr(sa, "obstacle", lambda *a: None)
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=20))
    out: list[Any] = [None] * group.world

    def rank(r: int) -> None:
        out[r] = sa.set_up(store, "g", r, group.world, torch.device("cpu"), torch.float32,
                           4096, mode, backend=group.backend(r))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(group.world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_set_up_sums_on_every_rank(monkeypatch):
    results = _set_up_all(_Symmetric(2), monkeypatch)
    assert all(symm is not None and why is None for symm, why in results)
    assert results[0][0].fused_copy and results[0][0].describe()["one_shot_max_bytes"] == 4096


def test_set_up_without_the_fused_copy_kernel_copies_first(monkeypatch):
    results = _set_up_all(_Symmetric(2, fused=False), monkeypatch, mode="symm")
    assert all(symm is not None and not symm.fused_copy for symm, _ in results)


@pytest.mark.parametrize("fail, said", [
    (("buffer", 1), "rank 1, buffer: RuntimeError: CUDA driver error: out of memory"),
    (("rendezvous", 0), "rank 0, rendezvous: RuntimeError: cuMemImportFromShareableHandle failed"),
])
def test_one_rank_failing_makes_every_rank_keep_nccl(monkeypatch, fail, said):
    results = _set_up_all(_Symmetric(2, fail=fail), monkeypatch)
    assert results == [(None, said), (None, said)]


def test_a_self_test_that_does_not_sum_keeps_nccl(monkeypatch):
    results = _set_up_all(_Symmetric(2, wrong=True), monkeypatch)
    assert results[0] == results[1] == (None, "rank 0, self-test: one_shot eagerly summed 1..1, "
                                              "not 3")


def _cpu_reducer() -> Reducer:
    store = dist.HashStore()
    return Reducer(store, 0, 1, torch.device("cpu"), timeout_s=30)


def test_reducer_sums_captured_tensors_on_symmetric_memory(monkeypatch):
    r = _cpu_reducer()
    r.use_symmetric_memory(None, 4096, torch.float32, graphs=True, log=None)
    assert r.describe() == {"used": "gloo", "why": None, "requested": "auto", "captured": {}}
    x = torch.ones(8)
    assert r.sum(x) is x and r.captured == {}  # gloo, in place
    r.nccl = True  # as on a GPU: a captured sum the rule takes goes to symmetric memory
    r.symm = SimpleNamespace(kernel=lambda t: "one_shot" if t.numel() <= 8 else None,
                             reduce=lambda t, k: t * 2)
    monkeypatch.setattr(r, "_reduce", lambda t, op: t + 100)  # stands for NCCL
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert r.sum(x).tolist() == [2.0] * 8 and r.sum(torch.ones(9)).tolist() == [101.0] * 9
    assert r.describe()["captured"] == {"one_shot": 1, "nccl": 1}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert r.sum(x).tolist() == [101.0] * 8  # an eager step: NCCL, whatever its size


def test_summary_says_which_all_reduce_and_why():
    assert sa.summary({"used": "gloo"}) == "gloo (CPU)"
    assert sa.summary({"used": "nccl", "why": "symmetric memory not used: rank 1, check: x"}) \
        == "NCCL (symmetric memory not used: rank 1, check: x)"
    line = sa.summary({"used": "symm", "one_shot_max_bytes": 2 * MiB, "two_shot_max_bytes": 2 * MiB,
                       "captured": {"one_shot": 616}})
    assert line == ("symmetric memory in the CUDA graphs (one-shot up to 2 MiB; NCCL above and in "
                    "eager steps); captured at start: 616 one-shot")
    assert "two-shot up to 8 MiB" in sa.summary(
        {"used": "symm", "one_shot_max_bytes": 256 * KiB, "two_shot_max_bytes": 8 * MiB})
