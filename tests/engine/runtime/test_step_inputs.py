"""A step's inputs as the host packs them (engine/runtime/step_inputs.py), for a model with a full
and a sliding-window KV cache group: every token's slot in each group is its block's id times the
block size plus its offset, read through that group's own table; the tables the kernels get hold
each sequence's entries (a sliding table's from its window's first block on, 0 before: entries
there may be dropped blocks, never read); a dropped block inside a window is refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.kv_groups import KVCacheGroup
from engine.runtime.kv_layout import KVLayout
from engine.runtime.protocols import StepItem
from engine.runtime.step_inputs import StepInputs

BS, WINDOW, POOL = 4, 6, 1000
LAYOUT = KVLayout((KVCacheGroup("full", (1, 3), None), KVCacheGroup("sliding", (0, 2), WINDOW)), 4)


def item(computed: int, new: int, seed: int) -> StepItem:
    """A sequence of `computed` cached tokens and `new` ones, its two tables as the engine keeps
    them: the sliding one's entries before its window's first block dropped (None)."""
    n = -(-(computed + new) // BS)
    full = [(seed * 37 + 11 * j) % POOL for j in range(n)]
    sliding = [(seed * 53 + 7 * j + 500) % POOL for j in range(n)]
    first = max(0, computed - WINDOW + 1) // BS
    sliding[:first] = [None] * first
    return StepItem(list(range(new)), computed, full, 1, (sliding,), seed)


items = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 9)), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(items=items)
def test_every_token_gets_its_slot_through_each_groups_table(items) -> None:
    batch = [item(c, n, i) for i, (c, n) in enumerate(items)]
    got = StepInputs(BS, LAYOUT, 4096, POOL).host(batch)
    t = 0
    for i, it in enumerate(batch):
        sliding = it.group_tables[0]
        first = max(0, it.num_computed - WINDOW + 1) // BS
        for g, table in enumerate((it.block_table, sliding)):
            row = list(got.tables[g][i][:len(table)])
            want = table if g == 0 else [0] * first + table[first:]
            assert row == want, (i, g, row, want)
        for k in range(len(it.token_ids)):
            pos = it.num_computed + k
            assert got.positions[t] == pos
            for g, table in enumerate((it.block_table, sliding)):
                assert got.slots[g][t] == table[pos // BS] * BS + pos % BS
            t += 1
    assert t == len(got.ids)


def test_a_dropped_block_inside_the_window_is_refused() -> None:
    seq = item(20, 3, 1)
    sliding = list(seq.group_tables[0])
    first = (20 - WINDOW + 1) // BS
    sliding[first] = None  # the window's first block, which the new tokens' queries read
    with pytest.raises(ValueError, match="sliding window still sees was dropped"):
        StepInputs(BS, LAYOUT, 4096, POOL).host([seq._replace(group_tables=(sliding,))])


def test_a_block_outside_the_pool_inside_the_window_is_refused() -> None:
    seq = item(20, 3, 1)
    sliding = list(seq.group_tables[0])
    sliding[-1] = POOL
    with pytest.raises(ValueError, match="outside the pool"):
        StepInputs(BS, LAYOUT, 4096, POOL).host([seq._replace(group_tables=(sliding,))])
