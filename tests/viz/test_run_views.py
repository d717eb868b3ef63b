"""The views of the run (viz/timeline.py, viz/memory.py, viz/prefix_tree_figure.py) against the
engine: the memory series with the snapshot's counts at every step of a run through swaps,
recompute, evictions, prefix hits and CPU tier loads; the timeline's cells with the engine's
timeline; the tree's cells with the engine's prefix tree; every text readable (4.5:1 on its
fill, 16 px and more in presenter mode) and every figure valid plotly."""

from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.describe.memory_use import memory_point
from engine.describe.request_timeline import STATES
from tests.engine.describe.test_request_timeline import _engine, _workload
from viz import palette
from viz.memory import GPU, memory_figure
from viz.prefix_tree_figure import KINDS, prefix_tree_figure
from viz.timeline import COLOURS, INDEX, timeline_figure

PRESENTER = (790, 330)  # a view's box beside the pool in presenter mode at 1280 x 720


def _served(mode: str, **kw):
    """A dry run with a shared system prompt, samples, swaps or recompute, and the tier:
    (engine, [(snapshot before, step result, snapshot after)])."""
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=22, preemption_mode=mode,
                                 max_num_batched_tokens=16, **kw))
    steps = []
    for i in range(60):
        if i < 10 and i % 2 == 0:
            eng.add_request("You are a kind tutor. " + f"question {i} " * 2,
                            SamplingParams(max_tokens=10, n=2 if i == 4 else 1, temperature=0.7,
                                           seed=i, ignore_eos=True))
        if i >= 10 and not eng.has_pending_work():
            break
        before = eng.snapshot()
        result = eng.step()
        steps.append((before, result, eng.snapshot()))
    return eng, steps


@pytest.mark.parametrize("mode,extra", [("swap", {"num_cpu_blocks": 16, "num_offload_blocks": 5}),
                                        ("recompute", {"num_offload_blocks": 5})])
def test_the_memory_series_is_the_snapshots_counts_at_every_step(mode, extra):
    eng, steps = _served(mode, **extra)
    points = [memory_point(after, result.events) for _, result, after in steps]
    kinds = set()
    for p, (before, result, after) in zip(points, steps, strict=True):
        refs = [b.ref_count for b in after.blocks]
        assert (p.owned, p.shared) == (refs.count(1), sum(r > 1 for r in refs))
        assert p.owned + p.shared == after.metrics.used_blocks
        assert (p.cached, p.free) == (after.metrics.cached_blocks, after.metrics.free_blocks)
        assert p.owned + p.shared + p.cached + p.free == after.num_blocks
        assert p.swapped == after.metrics.extra["cpu_blocks_used"]
        assert p.tier == sum(1 for t in after.tier_blocks if t.state == "cached")
        m0, m1 = before.metrics, after.metrics
        assert p.preemptions == m1.extra["preemptions"] - m0.extra["preemptions"]
        assert p.evictions == m1.evictions - m0.evictions
        assert p.prefix_hits == m1.prefix_hit_blocks - m0.prefix_hit_blocks
        assert p.loads == m1.offload_hit_blocks - m0.offload_hit_blocks
        assert p.tokens == result.num_batched_tokens == m1.extra["batched_tokens"]
        assert p.decodes == result.num_decodes
        kinds |= {k for k in ("preemptions", "evictions", "prefix_hits", "loads", "swapped",
                              "tier") if getattr(p, k)}
    assert {"preemptions", "evictions", "prefix_hits", "tier"} <= kinds, kinds
    if mode == "swap":
        assert "swapped" in kinds
    fig = memory_figure(points, eng.pool_size(), points[5].step, box=PRESENTER, large=True)
    for field, words, _ in GPU:  # the drawn areas are the series
        trace = next(t for t in fig.data if t.name == words)
        assert list(trace.y) == [getattr(p, field) for p in points]
    assert fig.layout.meta["cursor"] == 5
    go.Figure(json.loads(fig.to_json()))


def test_the_timeline_draws_the_engines_cells_and_follows_the_cursor():
    eng = _engine("swap", num_cpu_blocks=7)
    _workload(eng)
    timeline = eng.request_timeline()
    beams = next(ln.request_id for ln in timeline.lanes if ln.kind == "beams")
    cols = timeline.columns
    fig = timeline_figure(timeline, cols[7], open_request=beams, selected=beams,
                          box=PRESENTER, large=True)
    heat = next(t for t in fig.data if t.name == "timeline cells")
    rows = fig.layout.meta["rows"]
    grid = dict(zip((ln.request_id for ln in timeline.lanes), timeline.grid(), strict=True))
    seqs = dict(timeline.seq_grid(beams))
    assert len(rows) == len(timeline.lanes) + len(seqs)  # the open group's sequences too
    for (rid, sid), z in zip(rows, heat.z, strict=True):
        cells = grid[rid] if sid is None else seqs[sid]
        assert list(z) == [None if c is None else INDEX[c.state] for c in cells]
    assert fig.layout.meta["cursor"] == 7 and list(fig.layout.meta["columns"]) == list(cols)
    cursor = fig.layout.shapes[0]
    assert (cursor.x0, cursor.x1) == (6.5, 7.5)
    labels = next(t for t in fig.data if t.name == "lanes")
    assert any("beams ×3 ▾" in t for t in labels.text)
    assert labels.textfont.size >= 16 and fig.layout.annotations[0].font.size >= 16
    go.Figure(json.loads(fig.to_json()))
    closed = timeline_figure(timeline, None, box=(380, 0))  # a phone: no cursor, short labels
    assert not closed.layout.shapes and len(closed.layout.meta["rows"]) == len(timeline.lanes)


def test_the_tree_draws_every_cached_block_and_marks_the_step():
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=30, num_offload_blocks=6))
    for name in ("Ada", "Bo", "Cy"):
        eng.add_request("You are a kind tutor. " + name, SamplingParams(max_tokens=4))
    while eng.has_pending_work():
        eng.step()
    before = eng.prefix_tree()
    eng.add_sequence("z" * 90)  # evicts: into the tier, or gone
    tree = eng.prefix_tree()
    fig = prefix_tree_figure(tree, eng.last_events, eng.decode, before=before, box=(1400, 900),
                             large=True)
    heat = next(t for t in fig.data if t.name == "prefix tree")
    drawn = {(c[0], c[1]) for row in heat.customdata for c in row if c[0] >= 0 or c[1] >= 0}
    shown = {(n.block_id if n.block_id is not None else -1,
              n.tier_slot if n.tier_slot is not None else -1) for n in tree.nodes}
    folds = [t for row in heat.text for t in row if t.startswith("…")]
    folded = sum(int(t.split()[1]) for t in folds)
    assert drawn <= shown and len(drawn) + folded == len(shown)  # every node, or in a fold
    marks = {t.name for t in fig.data if t.type == "scatter" and t.mode == "lines"}
    assert {"new hash", "offloaded to the tier"} <= marks
    assert heat.textfont.size >= 16
    go.Figure(json.loads(fig.to_json()))


def test_every_views_text_reads_on_its_fill():
    for state in STATES:
        fill = COLOURS[state]
        assert palette.contrast(palette.plotly_text_on(fill), fill) >= 4.5, state
    for words, fill in KINDS:
        assert palette.contrast(palette.plotly_text_on(fill), fill) >= 4.5, words


def test_the_tree_colours_blocks_as_the_pool_and_shows_siblings_it_has_room_for():
    """Issue 42, item 8: the tree drew every block one sequence holds in the first sequence's
    colour (the pool: its owner's), and on a slide's short view hid siblings behind "+2 more"
    that rows of one line had room for."""
    from viz.prefix_tree_figure import SCALE, sole_owners

    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=40))
    seqs = [eng.add_sequence("You are a kind tutor. Question " + q) for q in "ABCD"]
    eng.free(eng.add_sequence("You are a kind tutor. Question E, which no one holds now"))
    snap = eng.snapshot()
    colours = {round(lo * (len(SCALE) // 2)): c for (lo, c), _ in zip(SCALE[::2], SCALE[1::2], strict=True)}
    fig = prefix_tree_figure(eng.prefix_tree(snap), (), eng.decode, box=(760, 250), large=True,
                             owners=sole_owners(snap))
    heat = next(t for t in fig.data if t.name == "prefix tree")
    for zr, cr in zip(heat.z, heat.customdata, strict=True):
        for z, cd in zip(zr, cr, strict=True):
            block = snap.blocks[cd[0]] if cd[0] >= 0 else None
            if block is not None and block.ref_count == 1:
                assert colours[z] == palette.owner_colour(block.owners[0]), (cd, z)
            elif block is not None:  # shared or cached: the kind's colour, as in the pool
                want = palette.SHARED if block.ref_count > 1 else palette.CACHED
                assert colours[z] == want, (cd, z)
    assert len(seqs) == 4 and not [t for row in heat.text for t in row if t.startswith("+")]
