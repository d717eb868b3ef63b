"""The CPU backend's vectorised paged attention (paged_kernels/torch_attention.py) equals the reference loop.

The inputs come from `paged_kernels.testing.make_case`: random block tables, and every slot no sequence
owns (padding table entries, the tail of a partly filled block) full of NaN, so a gather that
lets a padded position through poisons the output.
"""

from __future__ import annotations

import pytest
import torch

from paged_kernels import reference, torch_attention
from paged_kernels.testing import make_case

CPU = torch.device("cpu")

# (q_lens, seq_lens). Each batch has groups of several items (the batched path) and lone ones
# (item by item); decode contexts span several size classes (<= 64, 65..128, ...).
BATCHES = {
    "decodes": ([1] * 9, [1, 5, 17, 40, 63, 64, 65, 130, 300]),
    "prefills": ([7, 33, 2, 70, 3, 12, 16, 9], [7, 33, 2, 70, 3, 12, 16, 9]),
    "prefills-after-prefix": ([3, 20, 2, 5, 4, 6], [40, 150, 129, 37, 39, 35]),
    "mixed": ([1, 12, 1, 1, 5, 1, 1, 1, 4, 6, 3], [70, 12, 1, 200, 64, 3, 30, 50, 10, 14, 16]),
}
# MIN_BATCHED per path: the engine's choice, every group batched, every item on its own.
PATHS = {"default": torch_attention.MIN_BATCHED, "batched": 1, "one-by-one": 1 << 30}


def case(batch: str, block_size: int, group: int, dtype: torch.dtype = torch.float32,
         seed: int = 0) -> dict:
    q_lens, seq_lens = BATCHES[batch]
    return make_case(block_size, 2, group, 32, q_lens, seq_lens, dtype=dtype, device=CPU,
                     seed=seed)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("block_size", [1, 16, 128])
def test_equals_the_reference_loop(batch, block_size, group, path, monkeypatch):
    monkeypatch.setattr(torch_attention, "MIN_BATCHED", PATHS[path])
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
    for min_batched in (1, torch_attention.MIN_BATCHED):
        monkeypatch.setattr(torch_attention, "MIN_BATCHED", min_batched)
        for batch in ("mixed", "prefills-after-prefix", "decodes"):
            c = case(batch, 4, 3)
            torch.testing.assert_close(torch_attention.paged_attention(**c),
                                       reference.paged_attention(**c), atol=1e-5, rtol=1e-5)


def test_one_long_sequence_is_not_padded_onto_the_short_ones():
    lens = [30] * 200 + [8000] + [100, 120]
    starts = list(range(len(lens) + 1))
    items = torch_attention._work_items(lens, starts, num_heads=9)
    groups = torch_attention._groups(items, num_heads=9, per_token=3 * 64)
    assert [[item[0] for item in g] for g in groups] == [list(range(200)), [201, 202], [200]]


def test_decodes_and_prefills_are_grouped_apart_and_a_long_prefill_is_chunked(monkeypatch):
    monkeypatch.setattr(torch_attention, "MAX_SCORE_ELEMENTS", 9 * 100 * 1000)
    lens, q_lens = [50, 40, 1000, 60], [1, 40, 1000, 1]
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    items = torch_attention._work_items(lens, starts, num_heads=9)
    chunks = [item for item in items if item[0] == 2]
    assert [(it[1] - starts[2], it[2], it[3]) for it in chunks] == [
        (j, 100, j + 100) for j in range(0, 1000, 100)]
    groups = torch_attention._groups(items, num_heads=9, per_token=3 * 64)
    assert [it[0] for it in groups[0]] == [0, 3]  # the decodes, together
    assert all(it[2] > 1 for g in groups[1:] for it in g)


def test_hints_are_ignored():
    """The decode-graph path passes its capture-time maxima, not the batch's: no effect here."""
    c = case("mixed", 16, 3)
    hinted = torch_attention.paged_attention(**c, max_query_len=1, max_seq_len=4096, num_splits=8)
    torch.testing.assert_close(hinted, torch_attention.paged_attention(**c), atol=0, rtol=0)
