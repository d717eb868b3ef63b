"""Kernel tests: Triton kernels vs the torch references, and the references vs dense float64.

On a machine without CUDA the Triton kernels run through Triton's CPU interpreter
(`TRITON_INTERPRET=1`, set by the folder's conftest.py before any kernel is defined), so shapes
stay tiny. With CUDA the same Triton tests compile real kernels, and the `cuda` tests add a bf16
accuracy check.
"""

from __future__ import annotations

import pytest
import torch

# Triton's interpreter is switched on (without CUDA) by the folder's preamble, triton_mode.py,
# which conftest.py imports before this module; if another folder's tests imported triton first,
# the Triton tests run in a fresh subprocess instead (test_fresh_process.py's, with the other
# modules', or test_triton_kernels_in_subprocess's).
from paged_kernels import get_kernel_ops, interpreter_enabled, reference, torch_attention, triton_available
from paged_kernels.testing import make_case, rel_error
from tests.paged_kernels.triton_mode import (
    DEVICE,
    HAS_CUDA,
    fallback_only,
    needs_cuda,
    needs_triton,
    rerun_triton_tests_in_a_fresh_process,
)


def _triton():
    """The Triton kernel modules (imported lazily: only tests that need them pay for it)."""
    from paged_kernels import cache_ops, paged_attention

    return paged_attention, cache_ops


@fallback_only
def test_triton_kernels_in_subprocess(request):
    """Fallback when triton was imported, uninterpreted, before this module: same tests, fresh
    interpreter-enabled process."""
    rerun_triton_tests_in_a_fresh_process(__file__, request)


# ---------------------------------------------------------------------------------------------
# The float64 oracle (the paged inputs come from paged_kernels.testing.make_case)


def dense_attention_f64(case: dict) -> torch.Tensor:
    """Causal GQA attention in float64 with K/V rebuilt slot by slot from the pages: independent
    of the reference's gather and head reshapes."""
    q = case["q"].double().cpu()
    k_cache, v_cache = case["k_cache"].double().cpu(), case["v_cache"].double().cpu()
    tables, lens = case["block_tables"].cpu(), case["seq_lens"].tolist()
    qsl = case["query_start_loc"].tolist()
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    out = torch.zeros_like(q)
    for i, seq_len in enumerate(lens):
        k = torch.stack([k_cache[tables[i, p // block_size], p % block_size]
                         for p in range(seq_len)])  # [L, Hkv, D]
        v = torch.stack([v_cache[tables[i, p // block_size], p % block_size]
                         for p in range(seq_len)])
        q_len = qsl[i + 1] - qsl[i]
        for j in range(q_len):
            pos = seq_len - q_len + j
            for h in range(q.shape[1]):
                scores = k[: pos + 1, h // group] @ q[qsl[i] + j, h] * case["scale"]
                out[qsl[i] + j, h] = torch.softmax(scores, 0) @ v[: pos + 1, h // group]
    return out


# (block_size, num_kv_heads, group, head_dim, q_lens, seq_lens): mixed prefill + decode batches,
# cached prefixes (q_len < seq_len), fresh prompts (q_len == seq_len), GQA ratios 1 / 3 / 8.
ATTN_CASES = {
    "bs1-g3-mixed": (1, 2, 3, 64, [4, 1, 1], [11, 7, 1]),
    "bs4-g1-prefix": (4, 2, 1, 64, [6, 1, 3], [6, 13, 21]),
    "bs4-g8-d128": (4, 1, 8, 128, [3, 1], [10, 9]),
    "bs16-g3-long-prefill": (16, 1, 3, 64, [25, 1], [40, 35]),
    "bs16-g8-d128-decode": (16, 1, 8, 128, [1, 1, 1], [33, 16, 1]),
    "bs4-g3-d128-prefix": (4, 2, 3, 128, [2, 5], [18, 5]),
    # a head of 80 (Phi-2's) in tiles of 128 columns: whole key tiles load masked by column too
    "bs16-g2-d80-long": (16, 1, 2, 80, [1, 20], [70, 40]),
}


# ---------------------------------------------------------------------------------------------
# The references against dense float64 attention


@pytest.mark.parametrize("name", ["bs1-g3-mixed", "bs4-g8-d128", "bs16-g3-long-prefill"])
def test_reference_attention_matches_dense_float64(name):
    case = make_case(*ATTN_CASES[name], device=torch.device("cpu"))
    out = reference.paged_attention(**case)
    assert out.dtype == case["q"].dtype and out.shape == case["q"].shape
    assert rel_error(out, dense_attention_f64(case)) < 1e-5


def test_reference_attention_bf16_within_tolerance():
    case = make_case(*ATTN_CASES["bs4-g1-prefix"], dtype=torch.bfloat16, device=torch.device("cpu"))
    out = reference.paged_attention(**case)
    assert out.dtype == torch.bfloat16
    assert rel_error(out, dense_attention_f64(case)) < 1e-2


def test_reference_write_kv_then_gather_roundtrip():
    k_cache = torch.zeros(5, 4, 2, 8)
    v_cache = torch.zeros_like(k_cache)
    key, value = torch.randn(6, 2, 8), torch.randn(6, 2, 8)
    slots = torch.tensor([13, 14, 15, 16, -1, 17])  # block 3 offsets 1..3, block 4 offsets 0..1
    reference.write_kv(key, value, k_cache, v_cache, slots)
    table = torch.tensor([2, 3, 4], dtype=torch.int32)
    k, v = reference.gather_kv(k_cache, v_cache, table, 10)
    keep = torch.tensor([0, 1, 2, 3, 5])
    assert torch.equal(k[5:], key[keep]) and torch.equal(v[5:], value[keep])
    assert k_cache[0].abs().sum() == 0  # untouched


# ---------------------------------------------------------------------------------------------
# Triton paged attention against the reference


@needs_triton
@pytest.mark.parametrize("name", list(ATTN_CASES))
def test_triton_attention_matches_reference(name):
    pa, _ = _triton()
    case = make_case(*ATTN_CASES[name])
    out = pa.paged_attention(**case)
    ref = reference.paged_attention(**case)
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


@needs_triton
def test_triton_attention_identity_table_and_hints():
    pa, _ = _triton()
    case = make_case(*ATTN_CASES["bs4-g1-prefix"], shuffle=False, seed=3)
    out = pa.paged_attention(**case, max_query_len=6, max_seq_len=21)
    torch.testing.assert_close(out, reference.paged_attention(**case), atol=2e-5, rtol=2e-5)


@needs_triton
@pytest.mark.parametrize(
    "name, num_splits",
    [("bs16-g8-d128-decode", 3), ("bs1-g3-mixed", 2), ("bs4-g3-d128-prefix", 4)],
)
def test_triton_split_k_matches_reference(name, num_splits):
    """The split-K path (partial outputs + log-sum-exp merge), also with more splits than some
    sequences have tiles (empty splits) and with multi-token queries."""
    pa, _ = _triton()
    case = make_case(*ATTN_CASES[name], seed=1)
    out = pa.paged_attention(**case, num_splits=num_splits)
    torch.testing.assert_close(out, reference.paged_attention(**case), atol=2e-5, rtol=2e-5)


@needs_triton
def test_triton_split_k_long_decode():
    pa, _ = _triton()
    case = make_case(16, 1, 3, 64, [1, 1], [200, 90], seed=2)
    out = pa.paged_attention(**case, num_splits=3, max_query_len=1, max_seq_len=200)
    torch.testing.assert_close(out, reference.paged_attention(**case), atol=2e-5, rtol=2e-5)


@needs_triton
def test_triton_attention_bf16():
    pa, _ = _triton()
    case = make_case(*ATTN_CASES["bs4-g1-prefix"], dtype=torch.bfloat16)
    out = pa.paged_attention(**case)
    assert out.dtype == torch.bfloat16
    assert rel_error(out, dense_attention_f64(case)) < 1e-2


@needs_cuda
def test_a_short_chunk_after_a_long_prefix_is_split(monkeypatch):
    """A prompt's last 4 tokens after 4,096 loaded ones (the CPU tier's repeat): one query tile
    a KV head is too small a grid, so the keys are split, and the result is still the oracle's."""
    import paged_kernels.paged_attention as pa_module

    chosen = []

    def spy(*args, **kw):
        chosen.append(choose(*args, **kw))
        return chosen[-1]

    choose = pa_module.choose_num_splits
    monkeypatch.setattr(pa_module, "choose_num_splits", spy)
    case = make_case(16, 4, 2, 64, [4], [4100], seed=5)
    out = pa_module.paged_attention(**case)
    assert chosen and chosen[0] > 1
    torch.testing.assert_close(out, reference.paged_attention(**case), atol=2e-5, rtol=2e-5)


def test_split_heuristic_only_for_few_long_decodes():
    from paged_kernels.paged_attention import choose_num_splits

    cpu = torch.device("cpu")
    assert choose_num_splits(1, 3, 8192, 64, cpu) == 1  # no split-K off the GPU
    if HAS_CUDA:
        assert choose_num_splits(1, 3, 8192, 64, DEVICE) > 1
        assert choose_num_splits(1, 3, 100, 64, DEVICE) == 1  # too short to be worth it
        assert choose_num_splits(256, 3, 8192, 64, DEVICE) == 1  # grid already fills the GPU


# ---------------------------------------------------------------------------------------------
# Cache operations


def _kv_cache(num_layers=3, num_blocks=10, block_size=4, heads=2, head_dim=8, device=DEVICE,
              dtype=torch.float32) -> torch.Tensor:
    return torch.randn(num_layers, 2, num_blocks, block_size, heads, head_dim).to(device, dtype)


@needs_triton
@pytest.mark.parametrize("block_size, heads, head_dim", [(1, 2, 64), (4, 3, 64), (16, 1, 128)])
def test_triton_write_kv_matches_reference(block_size, heads, head_dim):
    _, ops = _triton()
    kv = _kv_cache(num_layers=1, num_blocks=8, block_size=block_size, heads=heads,
                   head_dim=head_dim)
    # key / value as strided slices of one fused projection, as a model would produce them.
    fused = torch.randn(7, 2, heads, head_dim, device=DEVICE)
    key, value = fused[:, 0], fused[:, 1]
    slots = torch.randperm(8 * block_size)[:7].to(DEVICE)
    slots[3] = -1
    expected = kv.clone()
    reference.write_kv(key, value, expected[0, 0], expected[0, 1], slots)
    ops.write_kv(key, value, kv[0, 0], kv[0, 1], slots)
    assert torch.equal(kv, expected)
    flat_k = kv[0, 0].view(-1, heads, head_dim)
    assert torch.equal(flat_k[slots[0]], key[0])  # the direct reading of the contract


def _check_block_copy(copy_fn, device=DEVICE):
    kv = _kv_cache(device=device)
    before = kv.clone()
    src = torch.tensor([1, 4, 4, 7], device=device)  # one source may feed several copies
    dst = torch.tensor([2, 5, 9, 0], device=device)
    copy_fn(kv, src, dst)
    for s, d in zip(src.tolist(), dst.tolist(), strict=True):
        assert torch.equal(kv[:, :, d], before[:, :, s])  # every layer, K and V
    untouched = [b for b in range(kv.shape[2]) if b not in dst.tolist()]
    assert torch.equal(kv[:, :, untouched], before[:, :, untouched])  # sources included
    return kv


def test_reference_copy_blocks():
    _check_block_copy(reference.copy_blocks, torch.device("cpu"))


@needs_triton
def test_triton_copy_blocks_matches_reference():
    _, ops = _triton()
    _check_block_copy(ops.copy_blocks)
    kv = _kv_cache()
    expected = kv.clone()
    src, dst = torch.tensor([3, 8], device=DEVICE), torch.tensor([6, 1], device=DEVICE)
    ops.copy_blocks(kv, src, dst)
    reference.copy_blocks(expected, src, dst)
    assert torch.equal(kv, expected)
    ops.copy_blocks(kv, src[:0], dst[:0])  # nothing to copy: no launch, no error


def test_swap_blocks_round_trip_cpu():
    gpu_like = _kv_cache(device=torch.device("cpu"))
    host = torch.zeros(3, 2, 6, 4, 2, 8)
    out_ids, host_ids = torch.tensor([7, 2, 9]), torch.tensor([0, 5, 3])
    reference.swap_blocks(gpu_like, host, out_ids, host_ids)
    assert torch.equal(host[:, :, host_ids], gpu_like[:, :, out_ids])
    back = torch.zeros_like(gpu_like)
    in_ids = torch.tensor([1, 4, 8])
    reference.swap_blocks(host, back, host_ids, in_ids)
    assert torch.equal(back[:, :, in_ids], gpu_like[:, :, out_ids])


@needs_triton
def test_triton_swap_blocks_moves_scattered_blocks_both_ways():
    """The one-launch swap (on CUDA: straight into pinned host memory) equals the reference."""
    _, ops = _triton()
    dev_cache = _kv_cache()
    on_cuda = DEVICE.type == "cuda"
    host = torch.zeros(dev_cache.shape[:2] + (6,) + dev_cache.shape[3:], dtype=dev_cache.dtype,
                       pin_memory=on_cuda)
    out_ids, host_ids = torch.tensor([7, 2, 9]), torch.tensor([0, 5, 3])
    ops.swap_blocks(dev_cache, host, out_ids, host_ids)
    if on_cuda:
        torch.cuda.synchronize()  # the kernel writes host memory asynchronously
    expected = torch.zeros_like(host)
    reference.swap_blocks(dev_cache, expected, out_ids, host_ids)
    assert torch.equal(host, expected)
    back = torch.zeros_like(dev_cache)
    in_ids = torch.tensor([1, 4, 8])
    ops.swap_blocks(host, back, host_ids, in_ids)
    expected_back = torch.zeros_like(dev_cache)
    reference.swap_blocks(host, expected_back, host_ids, in_ids)
    assert torch.equal(back.cpu(), expected_back.cpu())
    assert torch.count_nonzero(back[:, :, [0, 2, 3]]) == 0  # nothing written outside the targets


@needs_cuda
def test_swap_blocks_round_trip_cuda_pinned_host():
    dev_cache = _kv_cache(dtype=torch.bfloat16)
    host = torch.zeros(dev_cache.shape[:2] + (6,) + dev_cache.shape[3:], dtype=torch.bfloat16,
                       pin_memory=True)
    out_ids = torch.tensor([7, 2, 9], device=DEVICE)
    host_ids = torch.tensor([0, 5, 3])
    reference.swap_blocks(dev_cache, host, out_ids, host_ids)
    assert torch.equal(host[:, :, host_ids], dev_cache[:, :, out_ids].cpu())
    back = torch.zeros_like(dev_cache)
    in_ids = torch.tensor([1, 4, 8], device=DEVICE)
    reference.swap_blocks(host, back, host_ids, in_ids)
    torch.cuda.synchronize()
    assert torch.equal(back[:, :, in_ids], dev_cache[:, :, out_ids])


# ---------------------------------------------------------------------------------------------
# Dispatch


def test_dispatch():
    cpu_ops = get_kernel_ops("cpu")
    assert cpu_ops.name == "reference" and cpu_ops.paged_attention is torch_attention.paged_attention
    assert get_kernel_ops(DEVICE, "reference").name == "reference"
    with pytest.raises(ValueError):
        get_kernel_ops("cpu", "cuda-graphs")
    if HAS_CUDA and triton_available():
        assert get_kernel_ops(DEVICE).name == "triton"
    if triton_available() and interpreter_enabled():
        assert get_kernel_ops("cpu", "triton").name == "triton"


def test_dispatch_refuses_triton_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises((ValueError, RuntimeError)):
        get_kernel_ops("cpu", "triton")


# ---------------------------------------------------------------------------------------------
# GPU: bf16 accuracy of the compiled kernels (skipped without CUDA)


@needs_cuda
@pytest.mark.parametrize("name", list(ATTN_CASES))
@pytest.mark.parametrize("num_splits", [None, 1, 4])
def test_cuda_bf16_attention_vs_float64(name, num_splits):
    ops = get_kernel_ops(DEVICE)
    case = make_case(*ATTN_CASES[name], dtype=torch.bfloat16, device=DEVICE)
    out = ops.paged_attention(**case, num_splits=num_splits)
    assert out.dtype == torch.bfloat16
    assert rel_error(out, dense_attention_f64(case)) <= 1e-2


@needs_cuda
def test_cuda_bf16_long_decode_split_k_vs_float64():
    ops = get_kernel_ops(DEVICE)
    # SmolLM2 shapes, 4 sequences of a few thousand tokens: the heuristic picks split-K.
    case = make_case(16, 3, 3, 64, [1] * 4, [3000, 2048, 517, 1], dtype=torch.bfloat16)
    out = ops.paged_attention(**case)
    ref = reference.paged_attention(**{k: (v.double() if k in ("q", "k_cache", "v_cache")
                                           else v) for k, v in case.items()})
    assert rel_error(out, ref) <= 1e-2


@needs_cuda
def test_cuda_cache_ops_bf16():
    ops = get_kernel_ops(DEVICE)
    _check_block_copy(ops.copy_blocks)
    kv = _kv_cache(dtype=torch.bfloat16)
    expected = kv.clone()
    key = torch.randn(5, 2, 8, device=DEVICE, dtype=torch.bfloat16)
    value = torch.randn_like(key)
    slots = torch.tensor([0, 9, -1, 38, 21], device=DEVICE)
    ops.write_kv(key, value, kv[1, 0], kv[1, 1], slots)
    reference.write_kv(key, value, expected[1, 0], expected[1, 1], slots)
    assert torch.equal(kv, expected)


# ---------------------------------------------------------------------------------------------
# The lean decoder's fused layer ops (paged_kernels/layer_ops.py) against their torch references


def _layer_ops():
    from paged_kernels import layer_ops, layer_reference

    return layer_ops, layer_reference


LAYER_DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if HAS_CUDA else [])


@needs_triton
@pytest.mark.parametrize("dtype", LAYER_DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_triton_add_rms_norm_matches_reference(dtype, with_residual):
    ops, ref = _layer_ops()
    x = torch.randn(5, 192).to(DEVICE, dtype)
    res = torch.randn(5, 192).to(DEVICE, dtype) if with_residual else None
    w = (1 + 0.1 * torch.randn(192)).to(DEVICE, dtype)
    out, res_out = ops.add_rms_norm(x, res, w, 1e-5)
    want, want_res = ref.add_rms_norm(x, res, w, 1e-5)
    torch.testing.assert_close(res_out, want_res, atol=0, rtol=0)  # the sum rounds alike
    torch.testing.assert_close(out, want, **({} if dtype == torch.float32 else
                                             {"atol": 2e-2, "rtol": 2e-2}))


@needs_triton
@pytest.mark.parametrize("dtype", LAYER_DTYPES)
@pytest.mark.parametrize("hq, hkv", [(3, 1), (9, 3), (4, 4)])
def test_triton_rope_write_kv_matches_reference(dtype, hq, hkv):
    ops, ref = _layer_ops()
    d, t, bs = 64, 6, 4
    qkv = torch.randn(t, (hq + 2 * hkv) * d).to(DEVICE, dtype)
    angles = torch.arange(50)[:, None] * (1e4 ** (-torch.arange(d // 2) / (d // 2)))[None]
    emb = torch.cat([angles, angles], -1)
    cos_sin = torch.cat([emb.cos(), emb.sin()], -1).to(DEVICE, dtype)
    positions = torch.tensor([0, 7, 8, 31, 2, 49], device=DEVICE)
    slots = torch.tensor([3, 17, -1, 30, 4, 9], device=DEVICE)  # -1: not cached
    caches = [torch.zeros(10, bs, hkv, d, dtype=dtype, device=DEVICE) for _ in range(4)]
    q = ops.rope_write_kv(qkv, cos_sin, positions, caches[0], caches[1], slots, hq, hkv)
    want = ref.rope_write_kv(qkv, cos_sin, positions, caches[2], caches[3], slots, hq, hkv)
    tol = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(q, want, **tol)
    torch.testing.assert_close(caches[0], caches[2], **tol)
    torch.testing.assert_close(caches[1], caches[3], atol=0, rtol=0)  # v is copied as is
    assert torch.count_nonzero(caches[0].flatten(2).abs().sum(-1)) == 5  # five slots written


@needs_triton
@pytest.mark.parametrize("dtype", LAYER_DTYPES)
def test_triton_silu_and_mul_matches_reference(dtype):
    ops, ref = _layer_ops()
    gate_up = torch.randn(3, 2 * 1536).to(DEVICE, dtype)
    tol = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(ops.silu_and_mul(gate_up), ref.silu_and_mul(gate_up), **tol)


def test_layer_references_follow_the_llama_modules():
    """The references compute what transformers' Llama modules compute (float64 inputs)."""
    from transformers.models.llama.modeling_llama import (
        LlamaRMSNorm,
        apply_rotary_pos_emb,
    )

    _, ref = _layer_ops()
    x, res = torch.randn(4, 32, dtype=torch.float64), torch.randn(4, 32, dtype=torch.float64)
    norm = LlamaRMSNorm(32, eps=1e-6).double()
    norm.weight.data.uniform_(0.5, 1.5)
    out, summed = ref.add_rms_norm(x, res, norm.weight, 1e-6)
    torch.testing.assert_close(out, norm(x + res))
    torch.testing.assert_close(summed, x + res)

    hq, hkv, d = 2, 1, 8
    qkv = torch.randn(3, (hq + 2 * hkv) * d, dtype=torch.float64)
    pos = torch.tensor([1, 5, 2])
    emb = torch.arange(8)[:, None] * torch.rand(d // 2, dtype=torch.float64)[None]
    emb = torch.cat([emb, emb], -1)
    cos_sin = torch.cat([emb.cos(), emb.sin()], -1)
    k_cache, v_cache = torch.zeros(2, 2, hkv, d, dtype=torch.float64), torch.zeros(2, 2, hkv, d,
                                                                                   dtype=torch.float64)
    q = ref.rope_write_kv(qkv, cos_sin, pos, k_cache, v_cache, torch.tensor([0, 1, 2]), hq, hkv)
    q_hf, k_hf = apply_rotary_pos_emb(
        qkv[:, : hq * d].view(3, hq, d).transpose(0, 1), qkv[:, hq * d:(hq + hkv) * d]
        .view(3, hkv, d).transpose(0, 1), emb[pos].cos(), emb[pos].sin(), unsqueeze_dim=0)
    torch.testing.assert_close(q, q_hf.transpose(0, 1))
    torch.testing.assert_close(k_cache.flatten(0, 1)[:3], k_hf.transpose(0, 1))

    gate_up = torch.randn(2, 16, dtype=torch.float64)
    torch.testing.assert_close(ref.silu_and_mul(gate_up),
                               torch.nn.functional.silu(gate_up[:, :8]) * gate_up[:, 8:])
