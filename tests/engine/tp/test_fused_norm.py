"""Where the graphs' fused sum + norm (engine/tp/fused_norm.py) may run, decided without a GPU:
what stops it, said in words, and which sums it takes. Its kernel between two processes is
tests/paged_kernels/test_lamport.py's; on two GPUs, tests/engine/tp/test_tp_gpu.py's."""

from __future__ import annotations

import pytest
import torch

from engine.tp import fused_norm
from engine.tp.fused_norm import FusedNorm, obstacle

CUDA = torch.device("cuda", 0)


@pytest.fixture
def multicast_off(monkeypatch):
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    monkeypatch.delenv(fused_norm.ENV, raising=False)


def test_what_stops_it_is_said(multicast_off, monkeypatch):
    assert obstacle(CUDA, 2, torch.bfloat16) is None
    assert obstacle(torch.device("cpu"), 2, torch.bfloat16) == "the ranks run on cpu, not CUDA"
    assert obstacle(CUDA, 3, torch.bfloat16) == "3 ranks"
    assert "int8" in obstacle(CUDA, 2, torch.int8)
    monkeypatch.setenv(fused_norm.ENV, "0")
    assert obstacle(CUDA, 2, torch.bfloat16) == "PAGEDLAB_TP_FUSED_NORM=0"
    monkeypatch.setenv(fused_norm.ENV, "1")
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0")
    assert "multicast" in obstacle(CUDA, 2, torch.bfloat16)


def test_it_takes_the_sums_its_buffer_holds():
    f = FusedNorm(torch.zeros(3 * 2 * 4 * 8, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.int64),
                  rank=0, world=2, rows=4, hidden=8)
    h, res = torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(4, 8, dtype=torch.bfloat16)
    assert f.applies(h, res) and f.applies(h[:1], res[:1])
    assert not f.applies(h, None)  # nothing to add: the first layer's norm
    assert not f.applies(torch.zeros(5, 8, dtype=torch.bfloat16), torch.zeros(5, 8, dtype=torch.bfloat16))
    assert not f.applies(h.float(), res.float())  # another dtype than the buffer's
    assert not f.applies(torch.zeros(4, 16, dtype=torch.bfloat16)[:, ::2], res)  # not contiguous


def test_above_its_measured_size_the_sum_and_norm_stay_apart():
    rows, hidden = 512, 2048  # 2 MiB of bf16: slower fused than apart on two H100s (run 3)
    f = FusedNorm(torch.zeros(1, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.int64),
                  rank=0, world=2, rows=rows, hidden=hidden)
    take = [t for t in (4, 32, 128, 256, 512)
            if f.applies(*(torch.zeros(t, hidden, dtype=torch.bfloat16) for _ in range(2)))]
    assert take == [4, 32, 128]  # up to 512 KiB
