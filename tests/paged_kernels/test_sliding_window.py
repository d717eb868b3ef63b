"""Sliding-window attention (`window=W`: query p sees keys p - W + 1..p) in the three paged
attention implementations: the reference loop, the vectorised torch backend and Triton.

The oracle here is independent of the paging: each sequence's K/V are drawn dense, attended with
a plain masked softmax in float64, and only then scattered into a paged cache through a shuffled
block table. Every slot no sequence owns is NaN. Placeholders: the engine drops the blocks wholly
left of a sequence's window and gives them back to the pool, so their table entries may point
anywhere (block 0, another sequence's block); the tests point them at NaN, at huge values or at
block 0 and require the very same output, bit for bit. Triton, interpreted at a cost per
launch, runs once over NaN placeholders and must give the oracle's output: a placeholder it
read would turn rows into NaN.
"""

from __future__ import annotations

import pytest
import torch

from paged_kernels import reference, torch_attention
from paged_kernels.testing import rel_error
from tests.paged_kernels.triton_mode import (
    DEVICE,
    fallback_only,
    needs_triton,
    rerun_triton_tests_in_a_fresh_process,
)

CPU = torch.device("cpu")
HUGE = 1.0e4


def _triton():
    from paged_kernels import paged_attention

    return paged_attention


@fallback_only
def test_triton_sliding_window_in_subprocess(request):
    """Fallback when triton was imported, uninterpreted, before this module."""
    rerun_triton_tests_in_a_fresh_process(__file__, request)


# ---------------------------------------------------------------------------------------------
# Cases and the dense oracle


def window_case(block_size: int, q_lens: list[int], seq_lens: list[int], num_kv_heads: int = 2,
                group: int = 3, head_dim: int = 32, dtype: torch.dtype = torch.float32,
                seed: int = 0, device: torch.device = CPU,
                ) -> tuple[dict, list[torch.Tensor], list[torch.Tensor]]:
    """A paged case (the keyword arguments of paged_attention) on `device` and the dense K/V it
    was built from on the host, `[seq_len, num_kv_heads, head_dim]` per sequence (rounded to
    `dtype`). Two spare blocks
    follow the sequences' blocks: the last one holds NaN (the tables' padding points there), the
    one before holds HUGE (see `with_placeholders`)."""
    gen = torch.Generator().manual_seed(seed)
    ks = [torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype) for n in seq_lens]
    vs = [torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype) for n in seq_lens]
    pages = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(pages) + 2
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    k_cache[-2], v_cache[-2] = HUGE, HUGE
    order = torch.randperm(num_blocks - 2, generator=gen)
    tables = torch.full((len(seq_lens), max(pages) + 1), num_blocks - 1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(seq_lens):
        tables[i, :pages[i]] = order[used:used + pages[i]]
        used += pages[i]
        for p in range(n):  # slot by slot: no reshape shared with the implementations
            block = int(tables[i, p // block_size])
            k_cache[block, p % block_size], v_cache[block, p % block_size] = ks[i][p], vs[i][p]
    q = torch.randn(sum(q_lens), num_kv_heads * group, head_dim, generator=gen).to(dtype)
    qsl = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    case = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=tables,
                seq_lens=torch.tensor(seq_lens, dtype=torch.int32), query_start_loc=qsl)
    case = {key: value.to(device) for key, value in case.items()}
    return dict(case, scale=head_dim ** -0.5), ks, vs


def with_placeholders(case: dict, window: int, kind: str) -> tuple[dict, int]:
    """The case with every table entry of a block wholly left of its sequence's window (the
    window of its first query) replaced, as the engine may leave it: "nan" (a NaN block),
    "huge" (a block of HUGE) or "zero" (block 0, maybe another sequence's). Also returns how
    many entries were replaced."""
    num_blocks, block_size = case["k_cache"].shape[:2]
    junk = {"nan": num_blocks - 1, "huge": num_blocks - 2, "zero": 0}[kind]
    tables = case["block_tables"].clone()
    qsl, lens = case["query_start_loc"].tolist(), case["seq_lens"].tolist()
    replaced = 0
    for i, n in enumerate(lens):
        first_key = max(0, n - (qsl[i + 1] - qsl[i]) - window + 1)
        tables[i, :first_key // block_size] = junk  # block b ends at (b + 1) * bs - 1 < first_key
        replaced += first_key // block_size
    return dict(case, block_tables=tables), replaced


def dense_attention(case: dict, ks: list[torch.Tensor], vs: list[torch.Tensor],
                    window: int | None) -> torch.Tensor:
    """Masked softmax attention in float64 over the dense K/V (no block table): query p of a
    sequence sees key t when t <= p and, with a window, t > p - window."""
    q = case["q"].double().cpu()
    group = q.shape[1] // ks[0].shape[1]
    out = torch.empty_like(q)
    qsl = case["query_start_loc"].tolist()
    for i, (k, v) in enumerate(zip(ks, vs, strict=True)):
        n, q_len = k.shape[0], qsl[i + 1] - qsl[i]
        k = k.double().repeat_interleave(group, dim=1)  # [L, Hq, D]: query head h reads h // group
        v = v.double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[qsl[i]:qsl[i + 1]], k) * case["scale"]
        query_pos = torch.arange(n - q_len, n)[:, None]
        key_pos = torch.arange(n)[None, :]
        visible = key_pos <= query_pos
        if window:
            visible &= key_pos > query_pos - window
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        out[qsl[i]:qsl[i + 1]] = torch.einsum("hqk,khd->qhd", probs, v)
    return out


# Decodes (one of a 1-token context), a fresh prompt, prefill chunks after a cached prefix.
Q_LENS = [1, 7, 1, 1, 12, 1, 3, 5]
SEQ_LENS = [1, 7, 40, 65, 50, 17, 33, 5]
# Smaller than every context, not a multiple of any block size, equal to contexts (7, 33, 65),
# larger than every context.
WINDOWS = [1, 5, 7, 16, 33, 65, 1000]
# MIN_BATCHED per torch path: the engine's choice, every group batched, every item on its own.
TORCH_PATHS = {"default": torch_attention.MIN_BATCHED, "batched": 1, "one-by-one": 1 << 30}


def test_placeholder_rule_replaces_entries():
    """The placeholder tests below are not vacuous: the cases drop blocks for small windows."""
    case, _, _ = window_case(4, Q_LENS, SEQ_LENS)
    assert with_placeholders(case, 5, "nan")[1] > 10
    assert with_placeholders(case, 1000, "nan")[1] == 0


# ---------------------------------------------------------------------------------------------
# The torch implementations


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("block_size", [1, 4, 16, 32])
def test_reference_matches_dense_oracle_and_ignores_placeholders(block_size, window):
    case, ks, vs = window_case(block_size, Q_LENS, SEQ_LENS, seed=block_size)
    out = reference.paged_attention(**case, window=window)
    assert rel_error(out, dense_attention(case, ks, vs, window)) < 1e-5
    for kind in ("nan", "huge", "zero"):
        dropped, _ = with_placeholders(case, window, kind)
        assert torch.equal(reference.paged_attention(**dropped, window=window), out), kind


@pytest.mark.parametrize("path", list(TORCH_PATHS))
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("block_size", [1, 4, 16, 32])
def test_torch_matches_dense_oracle_and_ignores_placeholders(block_size, window, path, monkeypatch):
    monkeypatch.setattr(torch_attention, "MIN_BATCHED", TORCH_PATHS[path])
    case, ks, vs = window_case(block_size, Q_LENS, SEQ_LENS, seed=block_size)
    out = torch_attention.paged_attention(**case, window=window)
    assert rel_error(out, dense_attention(case, ks, vs, window)) < 1e-5
    for kind in ("nan", "huge", "zero"):
        dropped, _ = with_placeholders(case, window, kind)
        assert torch.equal(torch_attention.paged_attention(**dropped, window=window), out), kind


def test_torch_query_chunks_and_bf16_with_a_window(monkeypatch):
    """A prefill too long for the score budget attends in query chunks, each with its own first
    visible block; bf16 gathers in bf16 and computes in float32."""
    monkeypatch.setattr(torch_attention, "MAX_SCORE_ELEMENTS", 6 * 12 * 50)
    case, ks, vs = window_case(4, Q_LENS, SEQ_LENS, seed=5)
    dropped, _ = with_placeholders(case, 9, "nan")
    out = torch_attention.paged_attention(**dropped, window=9)
    assert rel_error(out, dense_attention(case, ks, vs, 9)) < 1e-5
    case, ks, vs = window_case(4, Q_LENS, SEQ_LENS, dtype=torch.bfloat16, seed=6)
    out = torch_attention.paged_attention(**with_placeholders(case, 9, "nan")[0], window=9)
    assert out.dtype == torch.bfloat16
    assert rel_error(out, dense_attention(case, ks, vs, 9)) < 1e-2


@pytest.mark.parametrize("impl", [reference.paged_attention, torch_attention.paged_attention],
                         ids=["reference", "torch"])
def test_no_window_is_bit_identical(impl):
    case, _, _ = window_case(4, Q_LENS, SEQ_LENS, seed=7)
    plain = impl(**case)
    assert torch.equal(impl(**case, window=None), plain)
    assert torch.equal(impl(**case, window=0), plain)


# ---------------------------------------------------------------------------------------------
# Triton (through the interpreter on CPU: small cases)

# Decodes past several 16- and 64-key tiles, prefill chunks after a prefix, a fresh prompt.
TRITON_Q_LENS = [1, 9, 1, 4, 1, 6]
TRITON_SEQ_LENS = [150, 40, 1, 77, 33, 6]


def _small_tiles(monkeypatch, block_n: int) -> None:
    """Force BLOCK_N: 16-key tiles put window edges, causal tails and fast tiles in small cases."""
    pa = _triton()
    select = pa.select_config

    def small(*args):
        cfg = select(*args)
        cfg.block_n = block_n
        return cfg

    monkeypatch.setattr(pa, "select_config", small)


@needs_triton
@pytest.mark.parametrize(
    "block_size, window, block_n",
    [(1, 5, 16), (4, 1, 16), (4, 33, 16), (16, 40, 16), (16, 20, None), (32, 70, None),
     (4, 150, 16), (16, 1000, None)],
)
def test_triton_matches_dense_oracle_and_never_reads_placeholders(block_size, window, block_n,
                                                                  monkeypatch):
    """Windows inside, at and beyond the contexts; NaN placeholders must not even be loaded.

    One launch, over the tables with NaN placeholders, against the oracle of the real K/V: a
    placeholder block whose V entered the sum (even at weight 0) would make its rows NaN."""
    if block_n:
        _small_tiles(monkeypatch, block_n)
    pa = _triton()
    case, ks, vs = window_case(block_size, TRITON_Q_LENS, TRITON_SEQ_LENS, seed=block_size,
                               device=DEVICE)
    dropped, replaced = with_placeholders(case, window, "nan")
    assert replaced > 0 or window >= max(TRITON_SEQ_LENS)  # a window inside some context drops
    out = pa.paged_attention(**dropped, window=window)
    torch.testing.assert_close(out.double().cpu(), dense_attention(case, ks, vs, window),
                               atol=1e-5, rtol=1e-5)


@needs_triton
@pytest.mark.parametrize(
    "q_lens, seq_lens, block_size, window, num_splits",
    [([1, 1, 1], [200, 90, 3], 16, 50, 2),  # decode config (64-key tiles)
     ([1, 1, 1], [200, 90, 3], 4, 100, 3),
     (TRITON_Q_LENS, TRITON_SEQ_LENS, 4, 30, 4),  # prefill rows: some splits see no key of a row
     (TRITON_Q_LENS, TRITON_SEQ_LENS, 1, 7, 3)],
)
def test_triton_split_k_with_a_window(q_lens, seq_lens, block_size, window, num_splits,
                                      monkeypatch):
    """The splits divide only the in-window keys; partial results merge to the oracle."""
    heads = 2
    if max(q_lens) > 1:
        _small_tiles(monkeypatch, 16)
        # one KV head: the merge interprets a program per token and query head; the decodes
        # here and test_kernel_ops' split cases take two KV heads through the split path
        heads = 1
    pa = _triton()
    case, ks, vs = window_case(block_size, q_lens, seq_lens, num_kv_heads=heads, seed=num_splits,
                               device=DEVICE)
    dropped, _ = with_placeholders(case, window, "nan")
    out = pa.paged_attention(**dropped, window=window, num_splits=num_splits)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double().cpu(), dense_attention(case, ks, vs, window),
                               atol=1e-5, rtol=1e-5)


@needs_triton
def test_triton_bf16_with_a_window():
    pa = _triton()
    case, ks, vs = window_case(16, TRITON_Q_LENS, TRITON_SEQ_LENS, dtype=torch.bfloat16, seed=3,
                               device=DEVICE)
    out = pa.paged_attention(**with_placeholders(case, 20, "huge")[0], window=20)
    assert out.dtype == torch.bfloat16
    assert rel_error(out, dense_attention(case, ks, vs, 20)) < 1e-2


@needs_triton
def test_triton_no_window_is_bit_identical():
    """window=0 is no window (the default, None, is the plain call itself)."""
    pa = _triton()
    case, _, _ = window_case(4, TRITON_Q_LENS, TRITON_SEQ_LENS, seed=8, device=DEVICE)
    plain = pa.paged_attention(**case)
    assert torch.equal(pa.paged_attention(**case, window=0), plain)


@needs_triton
def test_triton_merge_of_rows_without_keys_is_zero_not_nan():
    """A row whose every split has lse = -inf (none in practice) merges to 0, not 0 / 0."""
    import triton

    pa = _triton()
    num_splits, tokens, heads, head_dim = 3, 2, 2, 32
    part_out = torch.randn(num_splits, tokens, heads, head_dim)
    part_lse = torch.randn(num_splits, tokens, heads)
    part_lse[:, 0, 1] = float("-inf")  # token 0, head 1: no split saw a key
    part_lse[0, 1, 0] = float("-inf")  # token 1, head 0: split 0 saw nothing
    part_out, part_lse = part_out.to(DEVICE), part_lse.to(DEVICE)
    out = torch.empty(tokens, heads, head_dim, device=DEVICE)
    pa._merge_splits_kernel[(tokens, heads)](
        part_out, part_lse, out, *part_out.stride()[:3], *part_lse.stride()[:2], *out.stride()[:2],
        HEAD_DIM=head_dim, BLOCK_D=head_dim, NUM_SPLITS=num_splits,
        SPLITS_P2=triton.next_power_of_2(num_splits),
    )
    out, part_out, part_lse = out.cpu(), part_out.cpu(), part_lse.cpu()
    assert torch.equal(out[0, 1], torch.zeros(head_dim))
    w = torch.softmax(part_lse[1:, 1, 0] * torch.log(torch.tensor(2.0)), 0)  # base-2 lse
    torch.testing.assert_close(out[1, 0], (w[:, None] * part_out[1:, 1, 0]).sum(0))


def test_split_heuristic_counts_only_the_window(monkeypatch):
    """A sliding-window decode reads at most W keys: that, not the context, sizes the splits."""
    from paged_kernels import attention_config

    monkeypatch.setattr(attention_config, "_num_sms", lambda device: 132)
    cuda = torch.device("cuda")  # only its type is read here: no GPU needed
    assert attention_config.choose_num_splits(1, 3, 8192, 64, cuda) == 64
    assert attention_config.choose_num_splits(1, 3, 8192, 64, cuda, window=1024) == 8
    assert attention_config.choose_num_splits(1, 3, 8192, 64, cuda, window=200) == 1
    assert attention_config.choose_num_splits(1, 3, 600, 64, cuda, window=4096) == 4


def test_a_grid_of_two_programs_per_sm_is_not_split(monkeypatch):
    """On an H100 a 1.2B decode of 64 sequences (8 K/V heads: 512 programs on 132 SMs) ran
    faster unsplit (bench/results/mem_h100_kernel_probe_graph.json); half that grid still splits."""
    from paged_kernels import attention_config

    monkeypatch.setattr(attention_config, "_num_sms", lambda device: 132)
    cuda = torch.device("cuda")
    assert attention_config.choose_num_splits(64, 8, 560, 16, cuda) == 1
    assert attention_config.choose_num_splits(32, 8, 560, 16, cuda) == 2


def test_a_grid_under_one_program_per_sm_splits_to_about_eight(monkeypatch):
    """A few sequences (fewer programs than SMs) split to ~8 programs per SM in slices of at
    least 128 keys, a power of two, at most 64: the H200 sweep's fastest counts
    (bench/results/split_probe_h200.json) for 1, 4, 8 and 16 sequences over 4,100 keys, one
    over 16,384."""
    from paged_kernels import attention_config

    monkeypatch.setattr(attention_config, "_num_sms", lambda device: 132)
    cuda = torch.device("cuda")
    got = [attention_config.choose_num_splits(n, 8, 4100, 64, cuda) for n in (1, 4, 8, 16)]
    assert got == [32, 32, 16, 8]
    assert attention_config.choose_num_splits(1, 8, 16384, 64, cuda) == 64
    assert attention_config.choose_num_splits(1, 8, 100, 64, cuda) == 1  # too short to split
