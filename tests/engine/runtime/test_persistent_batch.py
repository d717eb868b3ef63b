"""The decode batch's block tables stay on the device (engine/runtime/persistent_batch.py): after
any sequence of steps, whatever the bookkeeping did to the tables in between (blocks appended, a
last block copied on write, a draft's blocks given back and others taken, a window's drops, a
sequence leaving and another taking its row), every row on the device reads its sequence's table.

And a verification step, its drafts padded to one length, computes what the general path
computes for the same tokens, and writes the K/V of no padding query."""

from __future__ import annotations

import hypothesis.strategies as st
import torch
from hypothesis import given, settings

from engine import SamplingParams
from engine.core.sampler_keys import SampleRequest
from engine.runtime.cache_engine import CacheEngine
from engine.runtime.model_runner import ModelRunner
from engine.runtime.persistent_batch import PersistentTables
from engine.runtime.protocols import StepItem
from engine.runtime.sampler import TorchScores

WIDTH, POOL = 12, 40


def sync(state: PersistentTables, tables: dict[int, list[int | None]]) -> tuple[list[int], int]:
    """One step: send the changes, scatter them on the device; returns rows and entries sent."""
    keys = sorted(tables)
    rows = state.rows_for(keys)
    index: list[int] = []
    value: list[int] = []
    state.changes(rows, [[tables[k] for k in keys]], index, value)
    if index:
        state.tables.view(-1).index_copy_(0, torch.tensor(index), torch.tensor(value, dtype=torch.int32))
    state.check(rows, [[tables[k] for k in keys]])
    return rows, len(index)


edits = st.lists(st.tuples(st.integers(0, 5), st.sampled_from(
    ["new", "append", "cow", "shrink", "regrow", "drop", "leave"]), st.integers(0, POOL - 1)),
    max_size=60)


@settings(max_examples=200, deadline=None)
@given(edits=edits)
def test_every_row_reads_its_sequences_table_after_any_edits(edits) -> None:
    state = PersistentTables(1, 6, WIDTH, torch.device("cpu"))
    tables: dict[int, list[int | None]] = {}
    for key, what, block in edits:
        table = tables.get(key)
        if what == "new" or table is None:
            tables[key] = [block]
        elif what == "append" and len(table) < WIDTH:
            table.append(block)
        elif what == "cow":
            table[-1] = block
        elif what == "shrink" and len(table) > 1:
            table.pop()
        elif what == "regrow" and len(table) > 2:  # two blocks given back, two others taken
            table[-2:] = [block, table[-1]]  # the same last id: only the one before changed
        elif what == "drop" and len(table) > 1:
            table[0] = None  # a window passed it: never read
        elif what == "leave":
            del tables[key]
        if tables:
            sync(state, tables)


def test_a_steady_step_sends_nothing_and_a_new_block_one_entry() -> None:
    state = PersistentTables(1, 4, WIDTH, torch.device("cpu"))
    tables = {7: [3, 4, 5], 9: [6]}
    assert sync(state, tables)[1] == 4  # two new rows: their whole tables
    assert sync(state, tables)[1] == 0  # nothing changed: nothing sent
    tables[9].append(11)
    assert sync(state, tables)[1] == 1
    rows, _ = sync(state, {9: tables[9]})  # 7 left: its row is free again
    assert sync(state, {9: tables[9], 8: [1, 2]})[0][0] in {rows[0]} | set(range(4))


def test_a_verification_step_equals_the_general_path(tiny_model) -> None:
    """Drafts of 3, 1 and 0 tokens and the 3-token rest of a prompt (its last token's logits
    only), padded to 4 queries a sequence: the static step's logits of every row the engine reads
    equal the general path's, and the K/V pools match (no padding query wrote). On a GPU this is
    the graph's step; on a CPU `static_queries` asks for it (the CPU verifies drafts packed)."""
    bs = 4
    general = ModelRunner(tiny_model, CacheEngine(tiny_model, 64, bs))
    static = ModelRunner(tiny_model, CacheEngine(tiny_model, 64, bs), max_batch=8, max_query=4,
                         static_queries=True)
    prompts = [[11, 12, 13, 14, 15, 16], [21, 22, 23], [31, 32, 33, 34, 35], [41, 42, 43, 44, 45]]
    drafts = [[7, 8, 9], [5], [], [51, 52]]
    tables = [[1, 3, 5], [7, 9], [11, 13, 15], [17, 19, 21]]
    batch = []
    for runner in (general, static):
        for p, t in zip(prompts, tables, strict=True):
            runner.execute([StepItem(p, 0, t)])
    for i, (p, d, t) in enumerate(zip(prompts, drafts, tables, strict=True)):
        logits = 1 if i == 3 else 1 + len(d)  # the last: a prompt's rest, not a draft
        batch.append(StepItem([40 + i] + d, len(p), t, logits, key=i))
    want = general.execute(batch)
    before = static.cache.kv_cache.clone()
    got = static.execute_scores(batch)
    rows = sum(s.num_logits for s in batch)
    # the engine's rows, each sequence's 1 + draft rows in turn, among the padded step's rows
    lp = torch.log_softmax(want, -1)
    assert [got.greedy(r)[0] for r in range(rows)] == want.argmax(-1).tolist()
    assert all(abs(got.greedy(r)[1] - float(lp[r].max())) < 1e-4 for r in range(rows))
    # a sampled draw reads the same row as it would among the general path's rows
    draws = [SampleRequest(r, SamplingParams(temperature=0.8, top_p=0.9), (r + 0.5) / (rows + 1))
             for r in range(rows)]
    plain = TorchScores(want).sample_many(draws)
    assert [t for t, _ in got.sample_many(draws)] == [t for t, _ in plain]
    torch.testing.assert_close(static.cache.kv_cache, general.cache.kv_cache, atol=1e-5, rtol=1e-4)
    changed = (static.cache.kv_cache != before).flatten(4).any(-1)  # [layer, kv, block, slot]
    written = {(s.block_table[p // bs], p % bs) for s in batch
               for p in range(s.num_computed, s.num_computed + len(s.token_ids))}
    assert {tuple(x) for x in changed.nonzero()[:, 2:].tolist()} == written


def test_a_prompt_longer_than_the_static_queries_goes_the_general_way(tiny_model) -> None:
    """A step with one long prefill among short rows cannot be padded: it runs packed, and its
    logits are the general path's."""
    bs = 4
    general = ModelRunner(tiny_model, CacheEngine(tiny_model, 64, bs))
    static = ModelRunner(tiny_model, CacheEngine(tiny_model, 64, bs), max_batch=8, max_query=4,
                         static_queries=True)
    batch = [StepItem(list(range(30, 41)), 0, [1, 3, 5], key=0),  # 11 tokens > 4
             StepItem([7], 0, [9], key=1)]
    torch.testing.assert_close(static.execute_scores(batch).logits, general.execute(batch),
                               atol=1e-5, rtol=1e-5)
    assert static.graphs.num_replays == 0 and not static.graphs.state._row_of


def test_a_windows_drop_sends_nothing_and_its_next_block_one_entry() -> None:
    """A sliding group's table: the window passes its first blocks (None: never read) while a
    new block comes at the end. Only the new entry goes to the device, never the whole row."""
    state = PersistentTables(1, 2, WIDTH, torch.device("cpu"))
    table: list[int | None] = [3, 4, 5, 6]
    assert sync(state, {0: table})[1] == 4
    table[:2] = [None, None]  # the window passed two blocks
    assert sync(state, {0: table})[1] == 0
    table.append(9)
    table[2] = None
    assert sync(state, {0: table})[1] == 1
    table[3] = 8  # a change where no window dropped anything: the row again (what it still reads)
    assert sync(state, {0: table})[1] == 2
