"""The CPU backend's vectorised paged attention (kernels/torch_attention.py) equals the reference loop.

The inputs come from test_kernels' `make_case`: random block tables, and every slot no sequence
owns (padding table entries, the tail of a partly filled block) full of NaN, so a gather that
lets a padded position through poisons the output.
"""

from __future__ import annotations

import pytest
import torch

from kernels import reference, torch_attention
from tests.test_kernels import make_case

CPU = torch.device("cpu")

# (q_lens, seq_lens). Decode lengths span several length groups (<= 64, 65..127, 128..255, ...).
BATCHES = {
    "decodes": ([1] * 9, [1, 5, 17, 40, 63, 64, 65, 130, 300]),
    "prefills": ([7, 33, 2, 70], [7, 33, 2, 70]),
    "prefills-after-prefix": ([3, 20, 2], [40, 150, 129]),
    "mixed": ([1, 12, 1, 1, 5, 1], [70, 12, 1, 200, 64, 3]),
}


def case(batch: str, block_size: int, group: int, dtype: torch.dtype = torch.float32,
         seed: int = 0) -> dict:
    q_lens, seq_lens = BATCHES[batch]
    return make_case(block_size, 2, group, 32, q_lens, seq_lens, dtype=dtype, device=CPU,
                     seed=seed)


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("block_size", [1, 16, 128])
def test_equals_the_reference_loop(batch, block_size, group):
    c = case(batch, block_size, group, seed=block_size + group)
    out = torch_attention.paged_attention(**c)
    assert out.dtype == c["q"].dtype and out.shape == c["q"].shape
    assert not out.isnan().any()
    torch.testing.assert_close(out, reference.paged_attention(**c), atol=1e-5, rtol=1e-5)


def test_float64_and_bfloat16_follow_the_reference():
    """float64 computes in float64; bf16 gathers in bf16 and computes in float32, as the loop."""
    c = case("mixed", 16, 3, dtype=torch.float64)
    torch.testing.assert_close(torch_attention.paged_attention(**c), reference.paged_attention(**c),
                               atol=1e-12, rtol=1e-12)
    c = case("mixed", 16, 3, dtype=torch.bfloat16)
    out = torch_attention.paged_attention(**c)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, reference.paged_attention(**c), atol=1e-2, rtol=1e-2)


def test_small_budgets_split_groups_and_prefill_queries(monkeypatch):
    """Bounded memory: decode groups split when their gather passes the budget, and a prefill
    attends in query chunks when its scores would; the answer stays the same."""
    monkeypatch.setattr(torch_attention, "MAX_GATHER_ELEMENTS", 64 * 2 * 32)
    monkeypatch.setattr(torch_attention, "MAX_SCORE_ELEMENTS", 3 * 2 * 150 * 7)
    for batch in ("mixed", "prefills-after-prefix", "decodes"):
        c = case(batch, 4, 3)
        torch.testing.assert_close(torch_attention.paged_attention(**c),
                                   reference.paged_attention(**c), atol=1e-5, rtol=1e-5)


def test_one_long_decode_is_not_padded_onto_the_short_ones():
    lens = [30] * 200 + [8000] + [100, 120]
    groups = torch_attention._decode_groups(list(range(len(lens))), lens, per_token=3 * 64)
    assert [len(g) for g in groups] == [200, 2, 1]
    assert groups[-1] == [200]
    assert sorted(i for g in groups for i in g) == list(range(len(lens)))


def test_hints_are_ignored():
    """The decode-graph path passes its capture-time maxima, not the batch's: no effect here."""
    c = case("mixed", 16, 3)
    hinted = torch_attention.paged_attention(**c, max_query_len=1, max_seq_len=4096, num_splits=8)
    torch.testing.assert_close(hinted, torch_attention.paged_attention(**c), atol=0, rtol=0)
