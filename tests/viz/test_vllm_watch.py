"""The watch view's figures (viz/vllm_watch.py), from a mirror folded from vLLM-schema events:
vLLM's cache in PagedLab's tree figure, the stored / removed timeline, the counts and what
events cannot show."""

from __future__ import annotations

import json

import plotly.graph_objects as go

from engine.vllm.mirror import CacheMirror
from engine.vllm.schema import VllmEvent
from engine.vllm.watch import CANNOT_SHOW
from viz.tree_layout import EVENTS, GHOST
from viz.vllm_watch import MAX_BARS, vllm_counts_html, vllm_timeline_figure, vllm_tree_figure


def stored(seq, hashes, parent, first=0, ts=None):
    return VllmEvent("stored", seq, ts if ts is not None else 100.0 + seq, tuple(hashes), parent,
                     tuple(range(first, first + 2 * len(hashes))), 2, "GPU")


def mirror_with_a_trunk() -> CacheMirror:
    m = CacheMirror()
    m.apply([stored(0, [1, 2], None)])
    m.apply([stored(1, [3], 2, first=10), stored(1, [4], 2, first=20)])
    return m


def heat(fig: go.Figure) -> go.Heatmap:
    return next(t for t in fig.data if t.type == "heatmap")


def test_vllms_cache_is_drawn_with_pagedlabs_tree_figure():
    m = mirror_with_a_trunk()
    before = m.tree()
    m.apply([VllmEvent("removed", 2, 102.0, (4,), medium="GPU")])
    fig = vllm_tree_figure(m.tree(), new={3}, removed={4}, before=before)
    cells = [z for row in heat(fig).z for z in row if z is not None]
    assert sorted(cells) == sorted([EVENTS, EVENTS, EVENTS, GHOST])  # 1, 2, 3 and 4 as a ghost
    hovers = " ".join(c[2] for row in heat(fig).customdata for c in row)
    assert "its events name no block id or ref count" in hovers
    marks = {t.name for t in fig.data if t.type == "scatter" and t.mode == "lines"}
    assert marks == {"edges", "new hash", "evicted"}
    assert "vLLM's cache, from its events" in fig.layout.title.text
    go.Figure(json.loads(fig.to_json()))


def test_an_empty_cache_says_so():
    fig = vllm_tree_figure(CacheMirror().tree())
    assert "send it a request" in fig.layout.annotations[0].text


def test_the_timeline_counts_every_block_stored_and_removed():
    m = mirror_with_a_trunk()
    m.apply([VllmEvent("removed", 2, 103.0, (3, 4), medium="GPU")])
    m.apply([VllmEvent("cleared", 3, 104.0)])
    fig = vllm_timeline_figure(list(m.timeline))
    up, down = fig.data
    assert sum(up.y) == 4 and -sum(down.y) == 2 and len(fig.layout.shapes) == 1
    # a long watch: messages share bars by time, none lost
    long = CacheMirror()
    for seq in range(1000):
        long.apply([stored(seq, [10_000 + seq], None, ts=seq * 0.01)])
    fig = vllm_timeline_figure(list(long.timeline))
    assert len(fig.data[0].x) <= MAX_BARS and sum(fig.data[0].y) == 1000


def test_the_counts_say_what_events_cannot_show():
    m = mirror_with_a_trunk()
    text = vllm_counts_html(m.counts(), "watching tcp://127.0.0.1:5557")
    assert "4 (4 physical copies)" in text and "tcp://127.0.0.1:5557" in text
    assert "physical block ids, block tables or reference counts" in CANNOT_SHOW
    assert "block tables or reference counts" in text


def test_the_empty_trees_sentence_fits_a_phone():
    """On a 390 px phone the sentence was cut at the right edge ("send it a reques")."""
    import re

    from engine.describe.prefix_tree import PrefixTree
    from viz.text_width import text_px
    from viz.vllm_watch import vllm_tree_figure

    fig = vllm_tree_figure(PrefixTree(nodes=()), box=(326, 120))
    note = fig.layout.annotations[0]
    assert "send it a request." in re.sub("<br>", " ", note.text)
    assert all(text_px(line, note.font.size) <= 326 - 24 for line in note.text.split("<br>"))
