"""KV cache groups in the picture: a hybrid model (full + sliding-window layers) draws a table row
per sequence and group, kept together; an entry a sliding window dropped is an empty hatched cell
with no link; a drop is outlined like a freed block; an all-sliding model's one row shows its
dropped entries too; the panels and the shards figure read the tables None-safe."""

from __future__ import annotations

import dataclasses
import json

import plotly.graph_objects as go

from engine import EngineConfig, LLMEngine, SamplingParams
from viz import metrics_html, pool_figure, sequences_html
from viz.draft_marks import draft_slots
from viz.pool_cells import DROPPED, PENDING
from viz.shards_figure import shards_figure

WINDOW = 8


def hybrid(num_blocks: int = 40, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=num_blocks,
                                  sliding_window=WINDOW, **kw))


def forked() -> tuple[LLMEngine, int, int]:
    """seq a: 47 tokens (12 logical blocks, the sliding table holds the last 2); b: its fork,
    3 tokens on (copy-on-write of both groups' last blocks)."""
    eng = hybrid()
    a = eng.add_sequence("hello world, this is a test")
    eng.append(a, n=20)
    b = eng.fork(a)
    eng.append(b, n=3)
    return eng, a, b


def trace(fig: go.Figure, name: str):
    return next((t for t in fig.data if t.name == name), None)


def row_labels(fig: go.Figure) -> list[str]:
    return [a.text for a in fig.layout.annotations if a.x == -0.3]


def test_a_hybrid_model_draws_a_row_per_sequence_and_group_kept_together():
    eng, a, b = forked()
    fig = pool_figure(eng.snapshot(), eng.last_events, eng.decode)
    go.Figure(json.loads(fig.to_json()))  # built unvalidated: valid plotly all the same
    # a sequence's name once, on its first row (a phone has no room for it twice)
    assert row_labels(fig) == ["seq 0 · full", f"sliding {WINDOW}", "seq 1 · full",
                               f"sliding {WINDOW}"]
    tables = trace(fig, "block tables")
    owners = [{cd[0] for cd in row if cd is not None} for row in tables.customdata]
    assert owners == [{a}, {a}, {b}, {b}]  # a click on any row names its sequence
    assert "groups: full + sliding 8" in fig.layout.title.text
    snap = eng.snapshot()
    label = {int(t.split("ˢ")[0].split(" ")[0]): t for t in trace(fig, "block ids").text}
    full, sliding = snap.sequences[a].block_tables["full"], snap.sequences[a].block_tables["sliding"]
    assert "ˢ" not in label[full[-1]] and label[sliding[-1]].startswith(f"{sliding[-1]}ˢ")
    pool = json.dumps(trace(fig, "pool").customdata)
    assert "group: sliding (8-token sliding window)" in pool and "group: full (full attention)" in pool


def test_dropped_entries_are_empty_cells_with_no_link():
    eng, a, b = forked()
    snap = eng.snapshot()
    fig = pool_figure(snap, eng.last_events, eng.decode)
    tables = trace(fig, "block tables")
    sliding = snap.sequences[a].block_tables["sliding"]
    gone = [j for j, blk in enumerate(sliding) if blk is None]
    assert gone == list(range(10))  # the window has passed all but the last two blocks
    for j in gone:
        assert tables.z[1][j] == DROPPED and tables.text[1][j] in ("—", "dropped")
        assert "dropped: left the 8-token window" in tables.customdata[1][j][1]
    assert DROPPED not in tables.z[0]  # the full row keeps every block
    for j in (10, 11):  # the window's blocks (narrow cells: the block id is in the hover)
        assert f"logical block {j} → physical block {sliding[j]}," in tables.customdata[1][j][1]
    held = sum(blk is not None for s in snap.sequences.values() for t in s.block_tables.values()
               for blk in t)
    links = trace(fig, "block table links")
    assert sum(x is None for x in links.x) == held  # one link per held entry, none per dropped
    assert trace(fig, "dropped entries") is not None
    assert "dropped (left the window)" in fig.layout.title.text


def test_a_single_group_picture_has_no_group_names_and_no_dropped_legend():
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=16))
    a = eng.add_sequence("abcdefg")
    eng.fork(a)
    fig = pool_figure(eng.snapshot(), eng.last_events, eng.decode)
    assert row_labels(fig) == ["seq 0", "seq 1"]
    assert trace(fig, "dropped entries") is None
    assert "dropped" not in fig.layout.title.text and "groups" not in fig.layout.title.text


def test_a_drop_is_outlined_like_a_freed_block():
    eng = hybrid(num_blocks=24)
    a = eng.add_sequence("hello world, this is")
    while not any(e.kind == "drop" for e in eng.last_events):
        eng.append(a, n=1)
    (drop,) = [e for e in eng.last_events if e.kind == "drop"]
    assert (drop.facts.group, drop.facts.window) == ("sliding", WINDOW)
    fig = pool_figure(eng.snapshot(), eng.last_events, eng.decode)
    freed = trace(fig, "freed")
    assert freed is not None and freed.line.dash == "dot"
    assert sum(x is None for x in freed.x) == len(drop.block_ids)
    assert "left the window" in trace(fig, "freed label").text[0]


def test_labels_selection_and_prefill_cells_cover_every_row_of_a_sequence():
    eng, a, b = forked()
    snap = eng.snapshot()
    fig = pool_figure(snap, eng.last_events, eng.decode, seq_labels={a: "Ada's request"},
                      selected_seq=b, selected_block=snap.sequences[a].block_tables["sliding"][-1])
    labels = row_labels(fig)
    assert labels[:2] == ["Ada's reque… · full", "<b>sliding 8</b>"]  # holds the block
    assert labels[2:] == ["<b>▶ seq 1 · full</b>", "<b>▶ sliding 8</b>"]
    outline = trace(fig, "selected sequence")
    assert max(outline.y) - min(outline.y) == 2  # one outline around both of seq 1's rows
    # a pending token (a model's) is drawn after every row's table, in each group's last block
    pend = {s: v._replace(pending_token=ord("!")) for s, v in snap.sequences.items()}
    fig = pool_figure(dataclasses.replace(snap, sequences=pend), (), eng.decode)
    tables = trace(fig, "block tables")
    n = len(snap.sequences[a].block_table)
    assert [tables.text[r][n] for r in (0, 1)] == ["▸", "▸"] and tables.z[1][n] == PENDING


def test_chunked_prefill_shows_the_rest_of_the_prompt_on_both_rows():
    eng = hybrid(max_num_batched_tokens=6)
    eng.add_request("y" * 20, SamplingParams(max_tokens=2))
    eng.step()
    view = eng.snapshot().sequences[0]
    tables = trace(pool_figure(eng.snapshot(), eng.last_events, eng.decode), "block tables")
    n = len(view.block_table)
    assert [tables.text[r][n].split()[0] for r in (0, 1)] == [f"+{view.prefill_rest}"] * 2


def test_a_long_sliding_table_folds_its_start_and_keeps_the_window_in_view():
    eng = hybrid(num_blocks=40)
    a = eng.add_sequence("hello world, this is a test")
    eng.append(a, n=80)  # 27 logical blocks: more than a row holds
    snap = eng.snapshot()
    tables = trace(pool_figure(snap, eng.last_events, eng.decode), "block tables")
    full, sliding = snap.sequences[a].block_tables["full"], snap.sequences[a].block_tables["sliding"]
    cols = len(tables.z[0])
    assert cols < len(full) + 1
    hidden = len(full) - (cols - 2)  # the "+N" cell first, then the last entries
    assert tables.text[0][0] == tables.text[1][0] == f"+{hidden}"
    assert tables.z[1][0] == DROPPED  # all that the sliding row hides was dropped
    assert "earlier logical block" in tables.customdata[0][0][1]
    last = len(full) - 1  # the last entry: in the same column in both rows
    assert f"logical block {last} → physical block {full[-1]}," in tables.customdata[0][cols - 2][1]
    assert f"logical block {last} → physical block {sliding[-1]}," in tables.customdata[1][cols - 2][1]


def one_sliding_group(snap):
    """An all-sliding model's snapshot (one group, "sliding"), made from a hybrid's: the dry mode
    gives a sliding window only with a full group beside it."""
    seqs = {s: v._replace(block_table=v.block_tables["sliding"],
                          block_tables={"sliding": v.block_tables["sliding"]})
            for s, v in snap.sequences.items()}
    blocks = tuple(b._replace(group="sliding") for b in snap.blocks)
    return dataclasses.replace(snap, sequences=seqs, blocks=blocks,
                               kv_cache_groups=snap.kv_cache_groups[1:])


def test_an_all_sliding_model_shows_its_dropped_entries_in_its_one_row():
    eng, a, b = forked()
    snap = one_sliding_group(eng.snapshot())
    fig = pool_figure(snap, eng.last_events, eng.decode, selected_seq=a)
    go.Figure(json.loads(fig.to_json()))
    assert row_labels(fig) == ["<b>▶ seq 0</b>", "seq 1"]
    tables = trace(fig, "block tables")
    assert list(tables.z[0][:10]) == [DROPPED] * 10 and DROPPED not in tables.z[0][10:]
    assert "sliding window: 8 tokens" in fig.layout.title.text
    assert "dropped (left the window)" in fig.layout.title.text
    assert "group: sliding" in json.dumps(trace(fig, "pool").customdata)
    html = sequences_html(snap, lambda t: eng.decode([t]))
    assert "47 tokens in 2 blocks, 10 dropped by the window" in html
    assert "logical block 0: dropped (left the 8-token window)" in html


def test_panels_and_shards_read_every_group():
    eng, a, _ = forked()
    snap = eng.snapshot()
    html = sequences_html(snap, lambda t: eng.decode([t]))
    assert "12 logical blocks · blocks held: full 12, sliding 2 (10 dropped)" in html
    assert "full → physical 0 · sliding: dropped (left the 8-token window)" in html
    metrics = metrics_html(snap, eng.engine_info(), eng.max_model_len)
    assert f"dropped by sliding windows</td><td><b>{snap.metrics.dropped_blocks} blocks" in metrics
    plain = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=16))
    plain.add_sequence("abc")
    assert "dropped by sliding" not in metrics_html(plain.snapshot(), plain.engine_info(), 64)
    fig = shards_figure(snap, {"tensor_parallel_size": 2})
    go.Figure(json.loads(fig.to_json()))
    tables = trace(fig, "block tables")
    assert "—" in tables.text and "None" not in tables.text
    notes = [n.text for n in fig.layout.annotations]
    assert "seq 0 · sliding 8" in notes and "seq 1 · full" in notes


def test_a_draft_is_marked_in_each_groups_block():
    # one matching token drafts (the dry mode's random tokens rarely repeat two in a row; a
    # lookup that misses waits longer each time)
    eng = hybrid(speculative_method="ngram", num_speculative_tokens=3, prompt_lookup_min=1)
    for tail in "wxyz":  # four requests: one of them soon continues its prompt's pattern
        eng.add_request("abc" * 6 + tail, SamplingParams(max_tokens=30))
    for _ in range(40):
        eng.step()
        snap = eng.snapshot()
        kept, rejected = draft_slots(eng.last_events, snap)
        if kept or rejected:
            break
    slots = kept + rejected
    assert slots, "no draft in 40 steps"
    groups = {snap.blocks[b].group for b, _, _ in slots}
    assert groups == {"full", "sliding"}  # the same slot, in both groups' blocks
    fig = pool_figure(snap, eng.last_events, eng.decode)
    go.Figure(json.loads(fig.to_json()))
    assert trace(fig, "draft kept") is not None or trace(fig, "draft rejected") is not None
