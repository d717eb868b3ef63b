"""Figures are pure functions of a snapshot and events: the pool as one heatmap of slots with
their tokens (block level for big pools), paper-style block tables, table->block links, the
event overlays that the page animates, selection, row labels, and a colour-blind-safe palette."""

import itertools
import json
import math
import time

import plotly.graph_objects as go

from engine import EngineConfig, LLMEngine, SamplingParams
from viz import event_log_markdown, metrics_html, palette, pool_figure, sequences_html
from viz.pool_cells import COLOURS, FREE, PENDING, SHARED
from viz.pool_layout import gpu_layout


def dry(num_blocks=16, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=num_blocks, **kw))


def heatmaps(fig):
    return [t for t in fig.data if isinstance(t, go.Heatmap)]


def trace(fig, name):
    return next((t for t in fig.data if t.name == name), None)


def cell(heat, block_id, slot=None):
    """(z, text, customdata) of a block's label cell (slot None) or one of its slots."""
    for r, row in enumerate(heat.customdata):
        for c, cd in enumerate(row):
            if cd is not None and cd[0] == block_id:
                c += 0 if slot is None else 1 + slot
                return heat.z[r][c], heat.text[r][c], heat.customdata[r][c]
    raise AssertionError(f"block {block_id} not drawn")


def test_empty_pool_draws_one_heatmap_of_empty_slots_and_no_cpu_pool():
    fig = pool_figure(dry().snapshot())
    (heat,) = heatmaps(fig)
    assert heat.name == "pool"
    assert {z for row in heat.z for z in row} <= {FREE, None}  # every block free, gaps None
    assert not fig.layout.shapes
    assert trace(fig, "cpu pool") is None  # this engine has no swap space
    assert trace(pool_figure(dry(num_cpu_blocks=4).snapshot()), "cpu pool") is not None


def test_each_slot_holds_its_token_and_empty_slots_stay_empty():
    eng = dry()
    a = eng.add_sequence("abcdefg")  # block 0: abcd (full), block 1: efg + one empty slot
    eng.fork(a)
    fig = pool_figure(eng.snapshot(), eng.last_events, eng.decode)
    pool = trace(fig, "pool")
    assert [cell(pool, 0, s)[1] for s in range(4)] == ["a", "b", "c", "d"]
    assert [cell(pool, 1, s)[1] for s in range(3)] == ["e", "f", "g"]
    z, text, custom = cell(pool, 1, 3)
    assert z == FREE and text == "" and "empty" in custom[-1]
    z, text, custom = cell(pool, 0)
    ids = trace(fig, "block ids")
    assert z == SHARED and ids.text[0] == "0 ×2"  # its own trace: drawn on a phone too
    assert custom[1].startswith("block 0 · used · ref 2 · seq 0,1 · 4/4")
    assert COLOURS[SHARED] == palette.SHARED
    tables = trace(fig, "block tables")
    assert tables.text[0][:2] == ["#0 4/4", "#1 3/4"]  # logical block -> physical block, filled
    assert [row[0][0] for row in tables.customdata] == [0, 1]  # a click names the sequence
    links = trace(fig, "block table links")
    assert sum(x is None for x in links.x) == 4  # two sequences x two logical blocks


def test_the_pending_token_is_marked_in_its_slot_and_after_the_table(default_model):
    eng = LLMEngine(EngineConfig(model="default", block_size=4, num_gpu_blocks=8, device="cpu",
                                 dtype="float32"))
    seq = eng.add_sequence("Four score and seven")
    snap = eng.snapshot()
    view = snap.sequences[seq]
    fig = pool_figure(snap, eng.last_events, eng.decode)
    pending = eng.decode([view.pending_token]).strip()
    tables = trace(fig, "block tables")
    shown = tables.text[0][len(view.block_table)]  # the cell after the table's last entry
    assert shown.startswith("▸ ") and pending[:3] in shown
    if view.num_tokens % 4:
        z, text, _ = cell(trace(fig, "pool"), view.block_table[-1], view.num_tokens % 4)
        assert z == PENDING and text.startswith("▸")


def test_a_sequence_mid_prefill_shows_what_is_left_of_its_prompt_after_its_table():
    eng = dry(num_blocks=32, max_num_batched_tokens=6)
    eng.add_request("y" * 20, SamplingParams(max_tokens=2))
    eng.step()  # 6 of 20 prompt tokens in; 14 to come
    snap = eng.snapshot()
    view = snap.sequences[0]
    assert (view.num_tokens, view.prefill_rest, view.pending_token) == (6, 14, None)
    tables = trace(pool_figure(snap, eng.last_events, eng.decode), "block tables")
    assert tables.z[0][len(view.block_table)] == PENDING
    assert tables.text[0][len(view.block_table)] == "+14 to prefill"


def test_big_pools_fall_back_to_one_cell_per_block():
    assert gpu_layout(64, 16).token_level and gpu_layout(300, 4).token_level
    assert not gpu_layout(1024, 16).token_level and not gpu_layout(64, 128).token_level
    eng = LLMEngine(EngineConfig(model=None, block_size=16, num_gpu_blocks=4096))
    for i in range(100):
        eng.add_sequence([i % 256] * 600)
    t = time.perf_counter()
    fig = pool_figure(eng.snapshot(), eng.last_events, eng.decode)
    elapsed = time.perf_counter() - t
    heat = trace(fig, "pool")
    assert len(heat.z) == 64 and len(heat.z[0]) == 64
    assert elapsed < 10  # generous: a functional bound, the benchmark measures the speed


def test_events_are_overlaid_for_the_page_to_animate():
    eng = dry(num_blocks=4)
    a = eng.add_sequence("abcdef")
    b = eng.fork(a)
    eng.append(b, token_ids=[120])
    fig = pool_figure(eng.snapshot(), eng.last_events)
    assert trace(fig, "copy-on-write") is not None  # an arrow from block 1 to its copy, block 2
    for name in ("new block", "new block cover"):
        assert trace(fig, name) is not None
    assert trace(fig, "new block cover").opacity == 0  # only the page's motion shows it
    eng.free(a)
    eng.free(b)
    eng.add_sequence("abcdxyz")  # hits block 0
    hit = pool_figure(eng.snapshot(), eng.last_events)
    assert trace(hit, "prefix hit") is not None and trace(hit, "prefix hit flash").opacity == 0
    eng2 = dry(num_blocks=2)
    eng2.free(eng2.add_sequence("abcdefgh"))
    eng2.add_sequence("zzzzzzzz")
    evicted = pool_figure(eng2.snapshot(), eng2.last_events)
    assert trace(evicted, "evicted") is not None and trace(evicted, "evicted ghost") is not None
    # the motion key changes with the step, not with a redraw of the same step
    assert fig.layout.meta["anim"] != hit.layout.meta["anim"]
    assert hit.layout.meta == pool_figure(eng.snapshot(), eng.last_events, selected_block=0).layout.meta


def test_selection_and_row_labels():
    eng = dry()
    a = eng.add_sequence("abcdefg")
    b = eng.fork(a)
    fig = pool_figure(eng.snapshot(), eng.last_events, eng.decode, seq_labels={b: "Ada's request"},
                      selected_seq=b, selected_block=1)
    labels = [n.text for n in fig.layout.annotations]
    assert "<b>seq 0</b>" in labels and "<b>▶ Ada's request</b>" in labels  # block 1's owners
    assert sum(x is None for x in trace(fig, "selected links").x) == 2  # both tables point at 1
    assert trace(fig, "selected") is not None and trace(fig, "selected sequence") is not None


def test_owner_colours_stay_apart_for_deuteranopes():
    colours = [*palette.OWNERS, palette.SHARED, palette.CACHED, palette.FREE]
    worst = min(math.dist(palette.lab(palette.deuteranopia(x)), palette.lab(palette.deuteranopia(y)))
                for x, y in itertools.combinations(colours, 2))
    assert worst > 10  # CIE76 delta E: a clearly visible difference
    red, green = palette.deuteranopia("#ff0000"), palette.deuteranopia("#00ff00")
    assert math.dist(palette.lab(red), palette.lab(green)) < 30  # the simulation does confuse them


def test_panels_show_narration_tokens_and_metrics():
    eng = dry()
    a = eng.add_sequence("hello")
    eng.fork(a)
    log = event_log_markdown(eng.last_events)
    assert "forked into seq 1" in log
    html = sequences_html(eng.snapshot(), lambda t: eng.decode([t]))
    assert "seq 0" in html and "logical block 1" in html
    metrics = metrics_html(eng.snapshot(), eng.engine_info(), eng.max_model_len)
    assert "2 of 16" in metrics  # blocks used
    assert "saved by sharing" in metrics and "2 blocks" in metrics


def test_the_unvalidated_figure_is_valid_plotly():
    """pool_figure skips plotly's (slow) validation; rebuilding its JSON with validation on
    catches a misspelt property in any trace, overlays included."""
    eng = dry(num_blocks=4, num_cpu_blocks=4)
    a = eng.add_sequence("abcdef")
    eng.append(eng.fork(a), token_ids=[120])  # new block + copy-on-write arrow
    fig = pool_figure(eng.snapshot(), eng.last_events, eng.decode, selected_seq=0, selected_block=0)
    go.Figure(json.loads(fig.to_json()))  # raises ValueError on anything invalid


def test_panels_count_one_block_and_one_token_in_the_singular():
    """'1 token in 1 block', '2 tokens in 2 blocks' (issue 23: '1 blocks')."""
    eng = LLMEngine(EngineConfig(model=None, block_size=1, num_gpu_blocks=8,
                                 enable_prefix_caching=False))
    eng.add_sequence("a")
    eng.add_sequence("ab")
    html = sequences_html(eng.snapshot(), lambda t: chr(t))
    assert "(running, 1 token in 1 block)" in html
    assert "(running, 2 tokens in 2 blocks)" in html
    metrics = metrics_html(eng.snapshot(), eng.engine_info(), 1)
    assert "<b>2 blocks (each sequence reserves 1 slot)</b>" in metrics
    assert "<b>0 blocks (0% of table entries)</b>" in metrics


def test_a_picture_without_tables_starts_at_the_pools_header():
    """No sequence holds a block (a new session, a class whose requests are done): no empty band
    where the tables would go; with one, the tables' rows sit above the pool's header."""
    for box in (None, (766.0, 600.0), (326.0, 500.0)):
        eng = dry()
        fig = pool_figure(eng.snapshot(), box=box)
        header = next(a for a in fig.layout.annotations if a.text.startswith("GPU pool"))
        assert fig.layout.yaxis.range[1] - header.y < 0.8, (box, fig.layout.yaxis.range, header.y)
        eng.add_sequence([1, 2, 3, 4, 5])
        fig = pool_figure(eng.snapshot(), box=box)
        header = next(a for a in fig.layout.annotations if a.text.startswith("GPU pool"))
        tables = next(a for a in fig.layout.annotations if a.text.startswith("block tables"))
        assert tables.y > header.y + 1 and fig.layout.yaxis.range[1] > tables.y, box


def test_the_cpu_tiers_labels_fit_their_cells_however_tall_the_rows():
    """The tier's labels ("t15") take the picture's type, which grows with its rows: in a
    fitted picture each stays inside its cell (lesson 14's first slide cut them once)."""
    from viz.text_width import text_px

    for box, large in (((766.0, 560.0), True), ((766.0, 900.0), True), ((326.0, 500.0), False)):
        snap = dry(16, num_offload_blocks=16).snapshot()
        fig = pool_figure(snap, box=box, large=large)
        tier = trace(fig, "cpu tier")
        width = fig.layout.width or box[0]  # a fitted picture is as wide as its box
        unit = (width - fig.layout.margin.l - fig.layout.margin.r) / (
            fig.layout.xaxis.range[1] - fig.layout.xaxis.range[0])
        cell = (tier.x[1] - tier.x[0]) * unit
        assert text_px("t15", tier.textfont.size) <= cell - 4, (box, tier.textfont.size, cell)
