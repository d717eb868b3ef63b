"""Figures are pure functions of a snapshot and events: one pool heatmap, right colours and hover
data, table->block links, and the event overlays."""

import time

import plotly.graph_objects as go

from engine import EngineConfig, LLMEngine
from viz import event_log_markdown, metrics_html, pool_figure, sequences_html
from viz.pool_figure import _COLOURS, _SHARED


def dry(num_blocks=16, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=num_blocks, **kw))


def heatmaps(fig):
    return [t for t in fig.data if isinstance(t, go.Heatmap)]


def trace(fig, name):
    return next((t for t in fig.data if t.name == name), None)


def test_empty_pool_draws_one_heatmap_of_free_blocks():
    eng = dry()
    fig = pool_figure(eng.snapshot())
    (heat,) = heatmaps(fig)
    assert {z for row in heat.z for z in row} == {0}  # every block free
    assert not fig.layout.shapes


def test_pool_cells_carry_state_colour_and_hover_data():
    eng = dry()
    a = eng.add_sequence("abcdefg")  # blocks 0 (full), 1 (3 of 4)
    eng.fork(a)
    fig = pool_figure(eng.snapshot(), eng.last_events, eng.decode)
    (heat,) = heatmaps(fig)
    assert heat.z[0][0] == _SHARED and heat.z[0][1] == _SHARED  # ref count 2
    assert _COLOURS[_SHARED] == "#f2b134"
    assert heat.text[0][0] == "2"
    block0 = heat.customdata[0][0]
    assert block0[:5] == ["0", "used", 2, "seq 0, seq 1", 4]
    assert block0[6] == "abcd"
    links = trace(fig, "block table links")
    assert sum(x is None for x in links.x) == 4  # two sequences x two logical blocks


def test_events_are_overlaid_cow_new_prefix_hit_and_eviction():
    eng = dry(num_blocks=4)
    a = eng.add_sequence("abcdef")
    b = eng.fork(a)
    eng.append(b, token_ids=[120])
    fig = pool_figure(eng.snapshot(), eng.last_events)
    cow = trace(fig, "copy-on-write")
    assert cow is not None and list(cow.x[:2]) == [1, 2]
    assert trace(fig, "new block") is not None
    eng.free(a)
    eng.free(b)
    eng.add_sequence("abcdxyz")  # hits block 0
    assert trace(pool_figure(eng.snapshot(), eng.last_events), "prefix hit") is not None
    eng2 = dry(num_blocks=2)
    eng2.free(eng2.add_sequence("abcdefgh"))
    eng2.add_sequence("zzzzzzzz")
    assert trace(pool_figure(eng2.snapshot(), eng2.last_events), "evicted") is not None


def test_a_4096_block_pool_still_draws_quickly():
    eng = LLMEngine(EngineConfig(model=None, block_size=16, num_gpu_blocks=4096))
    for i in range(100):
        eng.add_sequence([i % 256] * 600)
    t = time.perf_counter()
    fig = pool_figure(eng.snapshot(), eng.last_events, eng.decode)
    elapsed = time.perf_counter() - t
    (heat,) = heatmaps(fig)
    assert len(heat.z) == 64 and len(heat.z[0]) == 64
    assert elapsed < 10  # generous: a functional bound, the benchmark measures the speed


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
    import json

    eng = dry(num_blocks=4, num_cpu_blocks=4)
    a = eng.add_sequence("abcdef")
    eng.append(eng.fork(a), token_ids=[120])  # new block + copy-on-write arrow
    fig = pool_figure(eng.snapshot(), eng.last_events, eng.decode)
    go.Figure(json.loads(fig.to_json()))  # raises ValueError on anything invalid
