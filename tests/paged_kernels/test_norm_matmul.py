"""The norm folded into the matmul after it (paged_kernels/norm_matmul.py) against the layer
references composed (add_rms_norm, then the matmul, then silu_and_mul): the residual sum to the
bit, the normed rows' products to float32 precision, and a whole lean decode step, Triton
against the references, on a real Llama-shaped model."""

import pytest
import torch

from paged_kernels import layer_reference as ref
from tests.paged_kernels.triton_mode import (
    DEVICE,
    HAS_CUDA,
    fallback_only,
    needs_triton,
    rerun_triton_tests_in_a_fresh_process,
)

DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if HAS_CUDA else [])
# rows, hidden, output columns, a residual, a bias: one row; a tile and one row more; rows past
# one tile of rows with a width past one column tile; SmolLM2's qkv (576 -> 960), 32 sequences
SHAPES = [(1, 96, 80, True, False), (17, 64, 48, False, True), (70, 200, 40, True, True),
          (32, 576, 960, True, False)]


@fallback_only
def test_norm_matmul_kernels_in_subprocess(request):
    rerun_triton_tests_in_a_fresh_process(__file__, request)


def _inputs(rows: int, hidden: int, n: int, residual: bool, dtype: torch.dtype):
    g = torch.Generator().manual_seed(rows * 1000 + n)
    x = torch.randn(rows, hidden, generator=g).to(DEVICE, dtype)
    res = torch.randn(rows, hidden, generator=g).to(DEVICE, dtype) if residual else None
    norm_w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(DEVICE, dtype)
    weight = (torch.randn(n, hidden, generator=g) / hidden ** 0.5).to(DEVICE, dtype)
    return x, res, norm_w, weight


def _tolerance(dtype: torch.dtype) -> dict:
    # float32: the order of summation only; half types: one rounding of an output either way
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, hidden, n, residual, bias", SHAPES)
def test_triton_norm_linear_is_the_norm_then_the_matmul(rows, hidden, n, residual, bias, dtype):
    from paged_kernels.norm_matmul import norm_linear

    x, res, norm_w, weight = _inputs(rows, hidden, n, residual, dtype)
    b = torch.randn(n).to(DEVICE, dtype) if bias else None
    out, summed = norm_linear(x, res, norm_w, 1e-5, weight, b)
    want, want_summed = ref.norm_linear(x, res, norm_w, 1e-5, weight, b)
    torch.testing.assert_close(summed, want_summed, atol=0, rtol=0)  # the sum rounds alike
    torch.testing.assert_close(out, want, **_tolerance(dtype))
    if res is None:
        assert summed is x  # the first layer: the input is the residual, nothing copied


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, hidden, n, residual, bias", SHAPES[:3])
def test_triton_norm_gate_up_silu_is_the_norm_the_matmul_then_silu(rows, hidden, n, residual,
                                                                   bias, dtype):
    from paged_kernels.norm_matmul import norm_gate_up_silu

    x, res, norm_w, gate_up = _inputs(rows, hidden, 2 * n, residual, dtype)
    out, summed = norm_gate_up_silu(x, res, norm_w, 1e-5, gate_up)
    want, want_summed = ref.norm_gate_up_silu(x, res, norm_w, 1e-5, gate_up)
    assert out.shape == (rows, n)
    torch.testing.assert_close(summed, want_summed, atol=0, rtol=0)
    torch.testing.assert_close(out, want, **_tolerance(dtype))


@needs_triton
def test_triton_dispatch_keeps_prefill_steps_on_the_plain_matmul(monkeypatch):
    """Prefill-sized steps keep cuBLAS (ops.norm_matmul_rows says how many rows the kernels
    take), and the bench's switch turns the kernels off; the references take any step: they
    are the unfused path's own operations."""
    from paged_kernels import FUSED_NORM_MATMUL_ENV, get_kernel_ops
    from paged_kernels.norm_matmul import MAX_ROWS, fits

    assert fits(1) and fits(MAX_ROWS) and not fits(MAX_ROWS + 1) and not fits(0)
    assert get_kernel_ops(DEVICE, "triton").norm_matmul_rows == MAX_ROWS
    monkeypatch.setenv(FUSED_NORM_MATMUL_ENV, "0")
    assert get_kernel_ops(DEVICE, "triton").norm_matmul_rows == 0
    assert get_kernel_ops(DEVICE, "reference").norm_matmul_rows > 10 ** 6


@needs_triton
def test_triton_lean_steps_equal_the_reference_ops_on_a_real_model(tiny_model):
    """A prefill and a decode step of the lean decoder, through the Triton kernels (the norms
    inside the matmuls: both steps fit) and through the references, read the same logits and
    write the same KV (float32; HF's two-layer random Llama, on the GPU where there is one)."""
    from engine.runtime.cache_engine import CacheEngine
    from engine.runtime.model_runner import ModelRunner
    from engine.runtime.models import load_model
    from engine.runtime.protocols import StepItem

    loaded = load_model("tiny-random", device="cuda", dtype="float32") if HAS_CUDA else tiny_model
    ids = loaded.tokenizer("Paged attention splits the KV cache into blocks")["input_ids"]
    got = []
    for backend in ("triton", "reference"):
        runner = ModelRunner(loaded, CacheEngine(loaded, 16, 4, device=loaded.device,
                                                 dtype=loaded.dtype, kernel_backend=backend),
                             use_graphs=False)
        assert runner.lean is not None
        assert runner.cache.ops.norm_matmul_rows >= len(ids)  # the prefill is fused too
        prefill = runner.execute([StepItem(ids, 0, [3, 11, 7])])
        decode = runner.execute([StepItem([42], len(ids), [3, 11, 7])])
        got.append((prefill, decode, runner.cache.kv_cache.clone()))
    for triton_out, reference_out in zip(*got, strict=True):
        torch.testing.assert_close(triton_out, reference_out, atol=1e-4, rtol=1e-4)


def test_the_kernels_compile_for_an_h100_in_each_dtype():
    """Compiled, not interpreted, for sm_90 (no GPU needed): the interpreter runs a kernel's
    Python, so the kernels can pass the tests above and still not compile; the half types'
    products go to the tensor cores (mma), float32's stay full precision (no mma: tf32 would)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from paged_kernels import triton_available

    if not triton_available():
        pytest.skip("needs triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "tests.paged_kernels.compile_for_hopper", "norm_matmul"],
                          cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    mma = {line.split(":")[0]: int(line.rsplit("mma ", 1)[1]) for line in proc.stdout.strip().splitlines()}
    assert mma["bf16"] > 0 and mma["fp16"] > 0 and mma["fp32"] == 0, proc.stdout
