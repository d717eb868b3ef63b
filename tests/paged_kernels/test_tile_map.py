"""The attention kernel over a tile map: the grid a CUDA graph fixes at capture (a bucket of
tokens, a bucket of sequences), with the step's (sequence, query tile) pairs listed by the host.
Padding sequences (no query, no context) and padding tokens (past the last sequence's) must
change nothing the step's sequences get."""

import numpy as np
import pytest
import torch

from paged_kernels import reference
from paged_kernels.attention_config import query_tile, tile_map
from paged_kernels.testing import make_case
from tests.paged_kernels.triton_mode import (
    fallback_only,
    needs_triton,
    rerun_triton_tests_in_a_fresh_process,
)


@fallback_only
def test_tile_map_kernels_in_subprocess(request):
    rerun_triton_tests_in_a_fresh_process(__file__, request)


def test_a_tile_map_lists_each_sequences_tiles_in_order_then_pads():
    got = tile_map(np.array([5, 1, 0, 11]), 4, 9)
    assert got.dtype == np.int32
    assert got[0].tolist() == [0, 0, 1, 3, 3, 3, -1, -1, -1]
    assert got[1].tolist() == [0, 1, 0, 0, 1, 2, 0, 0, 0]


def test_a_tile_map_too_small_for_the_step_says_so():
    with pytest.raises(ValueError, match="6 query tiles, the map holds 5"):
        tile_map(np.array([5, 1, 11]), 4, 5)


def _padded(case: dict, seqs: int, tokens: int) -> dict:
    """The case in a graph's buffers: `seqs` sequence rows (the extra ones empty) and `tokens`
    query rows (the extra ones NaN: no sequence owns them)."""
    n, total, dev = case["seq_lens"].shape[0], case["q"].shape[0], case["q"].device
    q = torch.full((tokens,) + tuple(case["q"].shape[1:]), float("nan"), dtype=case["q"].dtype,
                   device=dev)
    q[:total] = case["q"]
    tables = torch.zeros((seqs, case["block_tables"].shape[1]), dtype=torch.int32, device=dev)
    tables[:n] = case["block_tables"]
    lens = torch.zeros(seqs, dtype=torch.int32, device=dev)
    lens[:n] = case["seq_lens"]
    starts = torch.full((seqs + 1,), total, dtype=torch.int32, device=dev)
    starts[:n + 1] = case["query_start_loc"]
    return dict(case, q=q, block_tables=tables, seq_lens=lens, query_start_loc=starts)


@needs_triton
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("shape", [(4, 2, 3, 64, [6, 1, 9, 1], [6, 13, 21, 3]),
                                   (16, 1, 8, 64, [25, 1], [40, 35])])
def test_triton_over_a_tile_map_equals_the_plain_grid(shape, window):
    from paged_kernels import paged_attention as pa

    case = make_case(*shape)
    want = reference.paged_attention(**case, window=window)
    tokens, seqs = 64, 6
    padded = _padded(case, seqs, tokens)
    group, head_dim = case["q"].shape[1] // case["k_cache"].shape[2], case["q"].shape[2]
    tile = query_tile(tokens, group, head_dim, shape[0])
    q_lens = np.diff(padded["query_start_loc"].cpu().numpy())
    entries = torch.from_numpy(tile_map(q_lens, tile, tokens // tile + seqs))
    out = pa.paged_attention(**padded, max_query_len=tokens, window=window,
                             tile_map=entries.to(case["q"].device))
    total = case["q"].shape[0]
    assert not out[:total].isnan().any()
    torch.testing.assert_close(out[:total], want, atol=2e-5, rtol=2e-5)
