"""The norm folded into the projection after it (paged_kernels/norm_linear.py) against the
separate steps it replaces (add_rms_norm, the matmul, silu_and_mul: paged_kernels/layer_reference.py).

The summed residual must come back bit for bit (it is the next layer's input); the projection
agrees up to the matmul's summation order. Shapes cover rows that are not a tile's multiple,
features that are not a tile's, a bias, no residual (the first layer), and a batch above the
fused kernels' rows, which must take the separate kernels and give their result.
"""

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
#: rows, hidden, features, with a bias, with a residual
SHAPES = [(5, 96, 48, True, True), (17, 128, 40, False, True), (3, 64, 32, False, False),
          (33, 80, 24, False, True)]


@fallback_only
def test_norm_linear_kernels_in_subprocess(request):
    rerun_triton_tests_in_a_fresh_process(__file__, request)


def _inputs(rows: int, hidden: int, out_rows: int, bias: bool, residual: bool, dtype):
    g = torch.Generator().manual_seed(rows * 1000 + hidden)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(DEVICE, dtype)

    return (rand(rows, hidden), rand(rows, hidden) if residual else None,
            (0.5 + torch.rand(hidden, generator=g)).to(DEVICE, dtype),
            rand(out_rows, hidden, scale=0.1), rand(out_rows, scale=0.5) if bias else None)


def _tolerance(dtype) -> dict:
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, hidden, features, bias, residual", SHAPES)
def test_triton_norm_linear_is_the_norm_then_the_matmul(dtype, rows, hidden, features, bias,
                                                        residual):
    from paged_kernels import norm_linear

    x, res, norm_w, weight, b = _inputs(rows, hidden, features, bias, residual, dtype)
    got, got_res = norm_linear.norm_linear(x, res, norm_w, 1e-5, weight, b)
    want, want_res = ref.norm_linear(x, res, norm_w, 1e-5, weight, b)
    assert torch.equal(got_res, want_res)
    assert got.shape == (rows, features) and got.dtype == dtype
    torch.testing.assert_close(got, want, **_tolerance(dtype))


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, hidden, features, bias, residual", SHAPES)
def test_triton_norm_silu_mlp_is_the_norm_the_matmul_then_silu_and_mul(dtype, rows, hidden,
                                                                       features, bias, residual):
    from paged_kernels import norm_linear

    x, res, norm_w, gate_up, _ = _inputs(rows, hidden, 2 * features, False, residual, dtype)
    got, got_res = norm_linear.norm_silu_mlp(x, res, norm_w, 1e-5, gate_up)
    want, want_res = ref.norm_silu_mlp(x, res, norm_w, 1e-5, gate_up)
    assert torch.equal(got_res, want_res)
    assert got.shape == (rows, features)
    torch.testing.assert_close(got, want, **_tolerance(dtype))


@needs_triton
def test_triton_a_batch_above_the_fused_rows_takes_the_separate_kernels(monkeypatch):
    """Past MAX_FUSED_ROWS (prefill chunks) the projection is the library's matmul of the norm's
    output: bit for bit what the separate kernels give."""
    from paged_kernels import layer_ops, norm_linear

    monkeypatch.setattr(norm_linear, "MAX_FUSED_ROWS", 4)
    x, res, norm_w, weight, _ = _inputs(6, 64, 32, False, True, torch.float32)
    assert not norm_linear.fused_rows(x) and norm_linear.fused_rows(x[:4])
    got, got_res = norm_linear.norm_linear(x, res, norm_w, 1e-5, weight)
    normed, summed = layer_ops.add_rms_norm(x, res, norm_w, 1e-5)
    assert torch.equal(got_res, summed)
    assert torch.equal(got, torch.nn.functional.linear(normed, weight))


def test_float32_on_a_gpu_keeps_the_library_matmul():
    from paged_kernels.norm_linear import fused_rows

    assert fused_rows(torch.zeros(8, 4, dtype=torch.float32))  # the CPU: the interpreter's tests
    if HAS_CUDA:
        assert not fused_rows(torch.zeros(8, 4, dtype=torch.float32, device="cuda"))
        assert fused_rows(torch.zeros(8, 4, dtype=torch.bfloat16, device="cuda"))


@needs_triton
def test_triton_a_lean_decode_step_through_the_fused_kernels_equals_the_module_path(tiny_model):
    """The whole decode step with the Triton ops (the norms folded into qkv and gate/up) against
    the model's own modules: the same logits and the same K/V written."""
    from engine.runtime.cache_engine import CacheEngine
    from engine.runtime.model_runner import ModelRunner
    from engine.runtime.protocols import StepItem

    prompts = [tiny_model.tokenizer(p)["input_ids"] for p in ("The capital of France is", "def f(x):")]
    tables = [[9, 2], [30, 5]]
    results = []
    for lean, backend in ((True, "triton"), (False, "reference")):
        runner = ModelRunner(tiny_model, CacheEngine(tiny_model, 32, 16, kernel_backend=backend),
                             use_lean=lean)
        assert (runner.lean is not None) == lean
        for ids, table in zip(prompts, tables, strict=True):
            runner.execute([StepItem(ids, 0, table)])
        scores = runner.execute_scores([StepItem([42], len(p), t)
                                        for p, t in zip(prompts, tables, strict=True)])
        results.append((scores.logits.clone(), runner.cache.kv_cache.clone()))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(results[0][1], results[1][1], atol=1e-4, rtol=1e-4)
