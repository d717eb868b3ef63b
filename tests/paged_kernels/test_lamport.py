"""The fused all-reduce + residual add + RMSNorm (paged_kernels/lamport.py) between two real processes
that map each other's buffers, under Triton's interpreter: every call's sum and norm equal the
reference's (the sum in rank order, then layer_reference.add_rms_norm), bit for bit where the
kernel and the reference round alike, with the slots coming round and rows of earlier calls
emptied; a rank whose peer never writes gives up with NaN and says so instead of hanging."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from paged_kernels.layer_reference import add_rms_norm
from tests.paged_kernels.lamport_rank import EPS, HIDDEN, ROW_COUNTS, ROWS, WORLD, inputs
from tests.paged_kernels.triton_mode import (
    DEVICE,
    fallback_only,
    needs_triton,
    rerun_triton_tests_in_a_fresh_process,
    triton_available,
)

ROOT = Path(__file__).resolve().parents[2]


def _empty_buffer(path: Path, n: int) -> None:
    path.write_bytes(b"\0" * 4 * n)
    torch.from_file(str(path), shared=True, size=n, dtype=torch.int32).fill_(-(1 << 31))  # -0.0


@pytest.mark.skipif(not triton_available(), reason="needs triton")
def test_two_ranks_sum_and_normalise_as_the_reference(tmp_path):
    """Two processes, each interpreting the kernel (on the CPU: the buffers are shared files)."""
    from paged_kernels.lamport import buffer_elements

    n = buffer_elements(WORLD, ROWS, HIDDEN)
    for q in range(WORLD):
        _empty_buffer(tmp_path / f"buffer{q}", n)
    env = os.environ | {"TRITON_INTERPRET": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.paged_kernels.lamport_rank", str(r),
                               str(tmp_path)], cwd=ROOT, env=env) for r in range(WORLD)]
    assert [p.wait(timeout=300) for p in procs] == [0] * WORLD
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for call in range(len(ROW_COUNTS)):
        parts = [inputs(call, r) for r in range(WORLD)]
        summed = parts[0][0] + parts[1][0]  # in rank order, in float32
        want_out, want_res = add_rms_norm(summed, parts[0][1], parts[0][2], EPS)
        for r in range(WORLD):
            out, res = ranks[r]["outputs"][call]
            assert torch.equal(res, want_res), (call, r)
            torch.testing.assert_close(out, want_out, rtol=1e-6, atol=1e-6)
        assert torch.equal(ranks[0]["outputs"][call][0], ranks[1]["outputs"][call][0])
    for r in range(WORLD):
        state = ranks[r]["state"].tolist()
        assert state[0] == len(ROW_COUNTS) % 3 and state[1] == 0 and state[5] == 0, state


@fallback_only
def test_triton_tests_in_a_fresh_process(request):
    rerun_triton_tests_in_a_fresh_process(__file__, request)


@needs_triton
def test_triton_a_peer_that_never_writes_gives_nan_and_a_flag_not_a_hang():
    from paged_kernels.lamport import STATE_INTS, buffer_elements, reduce_add_rms_norm

    n = buffer_elements(2, 2, 8)
    # on the GPU where there is one (the kernel takes device pointers), else the interpreter's CPU
    buffers = [torch.full((n,), -0.0, device=DEVICE) for _ in range(2)]
    peers = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device=DEVICE)
    state = torch.zeros(STATE_INTS, dtype=torch.int32, device=DEVICE)
    x, res, w = (torch.ones(shape, device=DEVICE) for shape in ((2, 8), (2, 8), (8,)))
    out, _ = reduce_add_rms_norm(x, res, w, EPS, peers, state, 0, 2, 2, max_spin=3)
    assert torch.isnan(out).all() and state[5] == 1


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_triton_one_rank_rounds_as_add_rms_norm_does(dtype):
    """Alone (a group of one), the kernel is layer_ops.add_rms_norm, bit for bit, in each dtype,
    partial sums of -0.0 included; the slot moves on with each call."""
    from paged_kernels.lamport import STATE_INTS, buffer_elements, empty_bits, reduce_add_rms_norm
    from paged_kernels.layer_ops import add_rms_norm as add_rms_norm_kernel

    buffer = torch.empty(buffer_elements(1, 4, HIDDEN), dtype=dtype, device=DEVICE)
    ints, empty = empty_bits(dtype)
    buffer.view(ints).fill_(empty)
    peers = torch.tensor([buffer.data_ptr()], dtype=torch.int64, device=DEVICE)
    state = torch.zeros(STATE_INTS, dtype=torch.int32, device=DEVICE)
    g = torch.Generator().manual_seed(5)
    for t in (3, 4, 1, 2):
        x, res = (torch.randn(t, HIDDEN, generator=g).to(DEVICE, dtype) for _ in range(2))
        x[:, ::4] = -0.0
        w = torch.randn(HIDDEN, generator=g).to(DEVICE, dtype)
        got = reduce_add_rms_norm(x, res, w, EPS, peers, state, 0, 1, 4, max_spin=50)
        want = add_rms_norm_kernel(x, res, w, EPS)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (dtype, t)
    assert state.tolist()[:2] == [4 % 3, 0] and state[5] == 0


@pytest.mark.skipif(not triton_available(), reason="needs triton")
def test_the_kernel_compiles_for_an_h100_in_each_dtype():
    """Compiled, not interpreted, for sm_90 (no GPU needed): the interpreter runs a kernel's
    Python, so a kernel can pass the tests above and still not compile; the own buffer's reads
    are volatile loads (the peers' writes are seen) and the launch counts itself atomically."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "tests.paged_kernels.compile_for_hopper"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["bf16", "fp16", "fp32"]
    for line in lines:
        assert "volatile loads 0" not in line and "atomic adds 0" not in line, line
